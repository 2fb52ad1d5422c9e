"""Trace replay: a recorded run's arrivals and sizes through the simulator (docs/replay.md).

Public API::

    from pipeline.replay import calibrate, compare, run_sweep
    cal = calibrate(con, run_id)                        # workload, policy, fitted model, noise
    cmp = compare(con, cal, seeds=[0, 1, 2])             # observed vs replayed (validation)
    cmp = compare(con, cal.with_policy(max_num_batched_tokens=512), [0])   # what-if
    sw = run_sweep(cal, "max_num_batched_tokens", [256, 512, 1024], [0, 1], slo=load_slo("slo.toml"))

:mod:`.calibrate` turns a run into simulator inputs, :mod:`.stats` computes a
replay's statistics from the simulator's arrays, :mod:`.validate` compares with
the observed run, :mod:`.sweep` varies one policy field against an SLO file,
:mod:`.chart` draws the sweep and :mod:`.trace` writes replays as canonical
traces (run id ``RUN~replay~<policy>-seed<k>``). User guide: docs/replay.md.
"""

from __future__ import annotations

from .calibrate import Calibration, calibrate
from .stats import replay_stats
from .sweep import Sweep, parse_sweep, run_sweep
from .trace import ingest_replay, replay_run_id, write_replay
from .validate import Comparison, compare, replay_once, replay_seeds

__all__ = [
    "Calibration",
    "Comparison",
    "Sweep",
    "calibrate",
    "compare",
    "ingest_replay",
    "parse_sweep",
    "replay_once",
    "replay_run_id",
    "replay_seeds",
    "replay_stats",
    "run_sweep",
    "write_replay",
]
