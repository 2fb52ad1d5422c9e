"""What-if sweeps: replay a run under several values of one policy setting, against an SLO file.

``--sweep max_num_batched_tokens=256,512,1024,2048`` replays the run once per
value and seed (everything else as recorded or as given) and tabulates the
replays' latency percentiles and throughput (mean over seeds).

With an SLO file (the audit's TOML, :func:`pipeline.slo.load_slo`) a setting
*meets* the SLOs when every ``[slo]`` percentile/mean/max limit and every
``[goodput]`` minimum holds in **every** seed (conservative: a setting that
passes only with lucky noise is not marked as meeting). Goodput is the audit's
(:func:`pipeline.slo.goodput`, the one implementation) on the comparison population
(requests that were ``ok`` in the recording): a request is good when it finished and
meets every per-request limit (TPOT counts as met for one-token outputs). ``[fluidity]`` is not
evaluated in sweeps (a note says so); run ``tracelat audit`` on an ingested
replay for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import InputError
from ..metrics import percentile_of
from ..settings import settings
from ..sim import Policy, SimResult
from ..slo import goodput, within_limit
from ..terminal import inline
from . import whatif as hw_whatif
from .calibrate import BOOL_FIELDS, POLICY_FIELDS, Calibration
from .stats import METRICS, request_latency
from .validate import replay_seeds

TABLE_STATS = (
    ("ttft_ms", "p50"),
    ("ttft_ms", "p99"),
    ("tpot_ms", "p50"),
    ("tpot_ms", "p99"),
    ("itl_ms", "p99"),
    ("e2e_ms", "p99"),
)


def parse_sweep(text: str) -> tuple[str, list[Any]]:
    """``"max_num_batched_tokens=256,512"`` -> ``("max_num_batched_tokens", [256, 512])``.

    NAME is any field of :class:`~pipeline.sim.Policy`; a whole-number field's values must
    be at least the field's declared minimum (its CLI option's range). NAME may also be a
    hardware what-if (:mod:`.whatif`): ``kv_dtype=bf16,fp8`` (known dtype names) or
    ``compute_speedup=1,2`` (factors > 0)."""
    name, eq, raw = text.partition("=")
    name = name.strip().replace("-", "_")
    if not eq or name not in (*POLICY_FIELDS, *hw_whatif.WHATIF_FIELDS):
        raise InputError(
            f"--sweep {text!r}: expected NAME=V1,V2,... with NAME one of "
            f"{', '.join((*POLICY_FIELDS, *hw_whatif.WHATIF_FIELDS))}, "
            "as in --sweep max_num_batched_tokens=256,512,1024,2048"
        )
    least = {f.name: s.min for f, s, _ in settings(Policy) if s.min is not None}
    values: list[Any] = []
    for item in (s.strip() for s in raw.split(",")):
        if not item:
            continue
        if name in hw_whatif.WHATIF_FIELDS:
            values.append(hw_whatif.parse_value(name, item, text))
            continue
        if name in BOOL_FIELDS:
            low = item.lower()
            if low not in ("true", "false", "on", "off", "1", "0", "yes", "no"):
                raise InputError(f"--sweep {text!r}: {name} values are true/false, got {item!r}")
            values.append(low in ("true", "on", "1", "yes"))
            continue
        try:
            v = int(item.replace("_", ""))
        except ValueError:
            raise InputError(f"--sweep {text!r}: {item!r} is not a whole number") from None
        if v < least.get(name, -math.inf):
            raise InputError(f"--sweep {text!r}: values must be >= {least[name]:g}, got {v}")
        values.append(v)
    if not values:
        raise InputError(f"--sweep {text!r}: no values given")
    return name, list(dict.fromkeys(values))


def replay_goodput(result: SimResult, ok_rows: np.ndarray, spec, duration_s: float) -> dict[str, Any]:
    """Goodput of one replay over the comparison population (see the module docstring)."""
    pop = np.asarray(ok_rows, bool)[: result.n_requests]
    con = request_latency(result, pop)  # the replay's requests as the store would hold them
    try:
        return goodput(con, "replay", spec, duration_s)
    finally:
        con.close()


@dataclass
class SweepRow:
    """One swept value: per-seed statistics, their means, and the SLO verdicts."""

    value: Any
    per_seed: list[dict[str, Any]]
    slo: list[dict[str, Any]] = field(default_factory=list)
    whatif: dict[str, Any] = field(default_factory=dict)  # hardware what-ifs of this row's replays

    def mean(self, section: str, stat: str) -> float | None:
        vals = np.array([(s.get(section) or {}).get(stat, np.nan) for s in self.per_seed], dtype=float)
        vals = vals[np.isfinite(vals)]
        return float(vals.mean()) if len(vals) else None

    @property
    def meets(self) -> bool | None:
        return all(c["meets"] for c in self.slo) if self.slo else None


def _slo_checks(spec, per_seed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    checks = []
    for lim in spec.limits:
        vals = [(s.get(lim.metric) or {}).get(lim.stat) for s in per_seed]
        ok = [v is not None and np.isfinite(v) and within_limit(v, lim.limit) for v in vals]
        checks.append(
            {
                "slo": lim.name,
                "limit": lim.limit,
                "kind": "upper",
                "values": vals,
                "seeds_meeting": sum(ok),
                "meets": all(ok),
            }
        )
    gp = spec.goodput
    if gp is not None:
        for key, stat in (
            ("min_attainment", "attainment"),
            ("min_request_goodput_rps", "request_goodput_rps"),
            ("min_token_goodput_tps", "token_goodput_tps"),
        ):
            minimum = getattr(gp, key)
            if minimum is None:
                continue
            vals = [s["goodput"][stat] for s in per_seed]
            ok = [v is not None and v >= minimum for v in vals]
            checks.append(
                {
                    "slo": f"goodput.{stat}",
                    "limit": minimum,
                    "kind": "lower",
                    "values": vals,
                    "seeds_meeting": sum(ok),
                    "meets": all(ok),
                }
            )
    return checks


@dataclass
class Sweep:
    """A what-if sweep of one policy field."""

    calibration: Calibration
    param: str
    seeds: list[int]
    rows: list[SweepRow]
    slo_path: str | None = None
    notes: list[str] = field(default_factory=list)
    # the recorded run's own statistics (validate.observed_stats), shown above the replayed rows:
    # the row replayed at the recorded setting differs from them by the replay's own error
    observed: dict[str, Any] | None = None

    def observed_value(self, section: str, stat: str) -> float | None:
        v = ((self.observed or {}).get(section) or {}).get(stat)
        return float(v) if v is not None else None

    @property
    def recorded_value(self) -> Any:
        if self.param in hw_whatif.WHATIF_FIELDS:
            return hw_whatif.recorded_value(self.calibration, self.param)
        return self.calibration.baseline_policy.get(self.param)

    def fixed_changes(self) -> list[str]:
        """What every row changes beside the swept setting: other policy fields, what-ifs, a workload file."""
        cal = self.calibration
        out = [f"{k}={v}" for k, v in cal.policy_changes().items() if k != self.param]
        out += [w["summary"] for k, w in cal.whatif.items() if k != self.param and isinstance(w, dict)]
        if cal.workload_source:
            out.append(f"workload {cal.workload_source}")
        return out

    def is_recorded(self, value: Any) -> bool:
        """Whether the row with ``value`` replays the recording as it was: ``value`` is what the
        recording had (a KV dtype of the recorded size counts) and nothing else was changed."""
        if self.fixed_changes():
            return False
        if self.param in hw_whatif.WHATIF_FIELDS:
            return hw_whatif.is_recorded(self.calibration, self.param, value)
        return value == self.recorded_value

    def to_dict(self) -> dict[str, Any]:
        cal = self.calibration
        return {
            "run_id": cal.run_id,
            "mode": "sweep",
            "param": self.param,
            "seeds": self.seeds,
            "recorded_value": self.recorded_value,
            "fixed_changes": self.fixed_changes(),
            "policy": cal.policy.to_dict(),
            "slo_file": self.slo_path,
            "what_if": cal.whatif,
            "model": cal.model.to_dict(),
            "noise": cal.noise.to_dict(),
            "calibration": cal.details,
            "observed": None
            if self.observed is None
            else {
                **{f"{m}_{s}": self.observed_value(m, s) for m, s in TABLE_STATS},
                "output_tokens_per_s": self.observed_value("throughput", "output_tokens_per_s"),
            },
            "rows": [
                {
                    "value": r.value,
                    "recorded": self.is_recorded(r.value),
                    "what_if": r.whatif,
                    **{f"{m}_{s}": r.mean(m, s) for m, s in TABLE_STATS},
                    "output_tokens_per_s": r.mean("throughput", "output_tokens_per_s"),
                    "meets_slo": r.meets,
                    "slo": r.slo,
                }
                for r in self.rows
            ],
            "notes": cal.notes + self.notes,
        }

    def format(self) -> str:
        cal = self.calibration
        head = f"sweep of {self.param} on {cal.run_id} ("
        fixed = [inline(x) for x in self.fixed_changes()]  # a workload's file name: one line of ours
        if fixed:  # every row runs these too, so no row is the recording
            head += f"every row with {'; '.join(fixed)}; "
        head += f"{len(self.seeds)} seed(s), noise {cal.details['noise_mode']}"
        head += f", SLOs from {inline(str(self.slo_path))})" if self.slo_path else ")"
        cols = [f"{m.removesuffix('_ms')} {s}" for m, s in TABLE_STATS] + ["tok/s"]
        lines = [
            head,
            "",
            f"{self.param:>24}" + "".join(f"{c:>11}" for c in cols) + ("   SLO" if self.slo_path else ""),
        ]
        if self.observed is not None:
            vals = [self.observed_value(m, s) for m, s in TABLE_STATS]
            vals.append(self.observed_value("throughput", "output_tokens_per_s"))
            lines.append(f"{'observed':>24}" + "".join(f"{_fmt(v):>11}" for v in vals))
        for r in self.rows:
            vals = [r.mean(m, s) for m, s in TABLE_STATS] + [r.mean("throughput", "output_tokens_per_s")]
            mark = " (as recorded)" if self.is_recorded(r.value) else ""
            line = f"{str(r.value) + mark:>24}" + "".join(f"{_fmt(v):>11}" for v in vals)
            if self.slo_path:
                failed = [c["slo"] for c in r.slo if not c["meets"]]
                line += "   meets" if not failed else "   fails: " + ", ".join(failed)
            lines.append(line)
        lines.append("")
        lines.append(
            "latencies in ms, mean over seeds"
            + ("; an SLO is met when it holds in every seed" if self.slo_path else "")
        )
        if self.observed is not None:
            lines.append(
                "observed: the recorded run itself"
                + (
                    "; the row marked (as recorded) is the replay at the recorded setting: "
                    "their difference is the replay's own error"
                    if any(self.is_recorded(r.value) for r in self.rows)
                    else " (for scale: no row replays the recording unchanged)"
                )
            )
        notes = cal.notes + self.notes
        if notes:
            lines += ["", "notes:"] + [f"  - {n}" for n in notes]
        return "\n".join(lines)


def _fmt(v: float | None) -> str:
    return "-" if v is None or not np.isfinite(v) else f"{v:.4g}"


def run_sweep(
    cal: Calibration,
    param: str,
    values: list[Any],
    seeds: list[int],
    slo=None,
    progress: Callable[[Any, int], None] | None = None,
) -> Sweep:
    """Replay ``cal`` under each value of ``param`` (and each seed); judge against ``slo`` (an SloSpec)."""
    extra: dict[str, float] = {}
    notes: list[str] = []
    if slo is not None:
        for lim in slo.limits:
            p = percentile_of(lim.stat)
            if lim.metric not in METRICS:
                raise InputError(f"{slo.path}: [slo] {lim.name}: metric not available in replays")
            if p is not None:
                extra[lim.stat] = p / 100
        if slo.fluidity is not None:
            notes.append(
                "the SLO file's [fluidity] section is not evaluated in sweeps; ingest a replay "
                "(--out ... --ingest) and run tracelat audit on it"
            )
    from ..sim.engine import check_fits

    for v in values:  # all checked before any replay: an infeasible last value would end a long sweep
        try:
            check_fits(cal.workload, cal.with_setting(param, v).policy)
        except InputError as exc:
            raise InputError(f"--sweep {param}={v}: {str(exc).rstrip('. ')}; leave {v} out of the sweep") from None
    if param == "kv_capacity_tokens" and "kv_dtype" in cal.whatif:
        notes.append(
            "the swept kv_capacity_tokens values are replayed as given: the --kv-dtype what-if does not rescale them"
        )
    rows = []
    for v in values:
        c = cal.with_setting(param, v)
        if param == "kv_capacity_tokens" and "kv_dtype" in c.whatif:  # the row ran the swept capacity
            c = replace(c, whatif={**c.whatif, "kv_dtype": hw_whatif.with_swept_capacity(c.whatif["kv_dtype"], v)})
        notes += [n for n in c.notes if n not in cal.notes and n not in notes]  # what a what-if value says

        def add_goodput(seed: int, result: SimResult, stats: dict[str, Any], c=c) -> None:
            if slo is not None and slo.goodput is not None:
                stats["goodput"] = replay_goodput(result, c.recorded_ok, slo.goodput, stats["throughput"]["duration_s"])
            if progress is not None:
                progress(v, seed)

        per_seed = replay_seeds(c, seeds, add_goodput, extra)
        rows.append(SweepRow(v, per_seed, _slo_checks(slo, per_seed) if slo is not None else [], c.whatif))
    return Sweep(cal, param, list(seeds), rows, slo.path if slo is not None else None, notes)
