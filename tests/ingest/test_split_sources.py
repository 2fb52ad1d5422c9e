"""One run from two files on two clocks: simulated runs split into server steps and client requests.

The single-file run is the truth: the same simulation ingested as one canonical file
(one clock, scheduling times and preemption counts known).  The split run must find
the clock offset, and give the same latencies, duration, queueing and tail causes.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import store
from pipeline.ingest import ingest_paths

from pipeline.sim.split import SCENARIOS
from pipeline.sim.split import scenario as _simulate


def _pair(tmp, kind: str, seed: int, client_origin: float):
    from pipeline.sim.split import write_split
    from pipeline.sim.writer import write_trace

    result, pol, model, noise = _simulate(kind, seed)
    single = write_trace(result, tmp / "single.jsonl", "single", pol, model, noise)
    truth = write_split(
        result, tmp / "server.jsonl", tmp / "client.jsonl", "split", pol, model, noise, client_origin_s=client_origin
    )
    con = store.connect(tmp / "t.duckdb")
    ingest_paths(con, [single])
    ingest_paths(con, [tmp / "server.jsonl", tmp / "client.jsonl"], run_id="split")
    store.build_derived(con)
    return con, truth, result


def _pct(con, run, metric):
    vals = con.execute(
        f"select {metric} from request_latency where run_id = ? and status = 'ok' and {metric} is not null", [run]
    ).fetchnumpy()[metric]
    return np.percentile(vals, [50, 90, 99]), len(vals)


def _explain(con, run, metric):
    from pipeline.fit import get_or_fit
    from pipeline.fit.attribution import explain

    get_or_fit(con, run)
    out = explain(con, run, metric)
    return out["largest"], {p["part"]: p["share"] for p in out["parts"]}


def check_split(tmp, kind: str, seed: int, client_origin: float = 5000.0) -> dict:
    con, truth, result = _pair(tmp, kind, seed, client_origin)
    info = con.execute(
        "select json_extract(meta, '$.clock_alignment.sources[0]') from runs where run_id = 'split'"
    ).fetchone()[0]
    import json

    info = json.loads(info)
    dur = result.iterations["t_end"] - result.iterations["t_start"]
    med_step = float(np.median(dur))
    out = {"offset_error_ms": (info["offset_s"] - truth) * 1e3, "median_step_ms": med_step * 1e3}
    assert info["status"] == "aligned"
    assert abs(info["offset_s"] - truth) <= med_step, out
    for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
        a, na = _pct(con, "single", metric)
        b, nb = _pct(con, "split", metric)
        assert na == nb
        # identical up to the resolution of a double holding unix seconds (0.24 us)
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-3, err_msg=metric)
    d = dict(con.execute("select run_id, duration_s from run_summary").fetchall())
    assert d["split"] == pytest.approx(d["single"], rel=0.01)
    qa, _ = _pct(con, "single", "queue_ms")
    qb, _ = _pct(con, "split", "queue_ms")
    out["queue_single"], out["queue_split"] = qa.tolist(), qb.tolist()
    for i in (0, 2):  # p50 and p99 within 10% (or a tenth of a step when the queue is near zero)
        assert abs(qb[i] - qa[i]) <= max(0.10 * qa[i], 0.1 * med_step * 1e3), out
    for metric in ("ttft", "tpot"):
        top_a, sh_a = _explain(con, "single", metric)
        top_b, sh_b = _explain(con, "split", metric)
        out[f"{metric}_top"] = (top_a, top_b)
        assert top_a == top_b, (metric, sh_a, sh_b)
        for part in set(sh_a) | set(sh_b):
            assert abs(sh_a.get(part, 0.0) - sh_b.get(part, 0.0)) <= 0.05, (metric, part, sh_a, sh_b)
    con.close()
    return out


@pytest.mark.parametrize("kind", SCENARIOS)
@pytest.mark.long
def test_split_run_equals_single_file_run(tmp_path, kind):
    check_split(tmp_path, kind, seed=1, client_origin=86_400.0 * 3 + 123.456)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("kind", SCENARIOS)
def test_split_run_ten_seeds(tmp_path, kind, seed):
    check_split(tmp_path, kind, seed=seed + 2, client_origin=600.0 + 7919.0 * seed)


def test_sampled_server_log_aligns_on_what_is_there(tmp_path):
    """An SGLang-like server file: every prefill step but only every 40th decode step, flagged
    decode_lines_sampled.  The offset comes from decode counts alone (within two median steps),
    nothing is inferred from step sums, and throughput scales the sampled lines back up."""
    import json

    import polars as pl

    from pipeline.sim.split import write_split

    result, pol, model, noise = _simulate("light", 4)
    truth = write_split(result, tmp_path / "server.jsonl", tmp_path / "client.jsonl", "s", pol, model, noise)
    lines = (tmp_path / "server.jsonl").read_text().splitlines()
    run = json.loads(lines[0])
    run["meta"].update(decode_lines_sampled=True, decode_log_interval=40)
    steps = pl.read_ndjson((tmp_path / "server.jsonl").open("rb").read().split(b"\n", 1)[1])
    decode_only = steps["prefill_tokens"] == 0
    keep = ~decode_only | (pl.Series(range(steps.height)) % 40 == 0)
    with (tmp_path / "sampled.jsonl").open("w") as fh:
        fh.write(json.dumps(run) + "\n")
        steps.filter(keep).write_ndjson(fh)
    con = store.connect(tmp_path / "s.duckdb")
    ingest_paths(con, [tmp_path / "sampled.jsonl", tmp_path / "client.jsonl"], run_id="s")
    store.build_derived(con)
    info = json.loads(con.execute("select json_extract(meta, '$.clock_alignment.sources[0]') from runs").fetchone()[0])
    med = float(np.median(result.iterations["t_end"] - result.iterations["t_start"]))
    assert info["status"] == "aligned" and abs(info["offset_s"] - truth) <= 2 * med, (info["offset_s"] - truth, med)
    assert "samples steps" in " ".join(info["notes"])
    assert "t_scheduled" not in (info.get("inferred") or {}).get("fields", [])


@pytest.mark.parametrize("kind", ["light", "incident"])
@pytest.mark.long
def test_engine_formats_vllm_log_and_aiperf(tmp_path, kind):
    """The split in engine formats: vLLM's default log (1-second stamps, durations to 10 us, no
    context tokens) and an AIPerf export from a client whose unix clock is 3.7 s behind.  The
    steps are re-timed from the client's tokens; latencies equal the single-file run's, queueing
    within 10% at p50 and p99, the same top tail cause."""
    import json

    from pipeline.sim.split import write_engine_pair
    from pipeline.sim.writer import write_trace

    result, pol, model, noise = _simulate(kind, 5)
    single = write_trace(result, tmp_path / "single.jsonl", "single", pol, model, noise)
    truth = write_engine_pair(result, tmp_path / "server.log", tmp_path / "profile_export.jsonl")
    con = store.connect(tmp_path / "e.duckdb")
    ingest_paths(con, [single])
    res = ingest_paths(con, [tmp_path / "server.log", tmp_path / "profile_export.jsonl"], run_id="split")
    assert [r.format for r in res] == ["vllm-log", "aiperf"]
    store.build_derived(con)
    info = json.loads(
        con.execute(
            "select json_extract(meta, '$.clock_alignment.sources[0]') from runs where run_id = 'split'"
        ).fetchone()[0]
    )
    med = float(np.median(result.iterations["t_end"] - result.iterations["t_start"]))
    assert info["status"] == "aligned" and info["retime"]["retimed"], info
    assert abs(info["offset_s"] - truth) <= med
    for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
        a, _ = _pct(con, "single", metric)
        b, _ = _pct(con, "split", metric)
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-3, err_msg=metric)
    qa, _ = _pct(con, "single", "queue_ms")
    qb, _ = _pct(con, "split", "queue_ms")
    for i in (0, 2):
        assert abs(qb[i] - qa[i]) <= max(0.10 * qa[i], 0.1 * med * 1e3), (qa, qb)
    for metric in ("ttft", "tpot"):
        assert _explain(con, "single", metric)[0] == _explain(con, "split", metric)[0]


@pytest.mark.long
def test_sglang_log_and_aiperf_carry_the_uncertainty_of_second_stamps(tmp_path):
    """SGLang stamps its batch lines to the second and logs one decode step in 40: no client re-times
    such steps, so the offset is good to a second (it said +-3.6 ms, 0.57 s from the truth, and no
    warning), and the alignment says why the steps were not re-timed."""
    import json

    from pipeline.sim.split import write_engine_pair, write_sglang_log

    result, *_ = _simulate("light", 3)
    truth = write_engine_pair(result, tmp_path / "vllm.log", tmp_path / "profile_export.jsonl")
    write_sglang_log(result, tmp_path / "sgl.log")
    con = store.connect(tmp_path / "g.duckdb")
    res = ingest_paths(con, [tmp_path / "sgl.log", tmp_path / "profile_export.jsonl"], run_id="g", tz="UTC")
    assert [r.format for r in res] == ["sglang-log", "aiperf"]
    (src,) = json.loads(
        con.execute("select json_extract(meta, '$.clock_alignment.sources') from runs where run_id = 'g'").fetchone()[0]
    )
    assert src["status"] == "aligned" and not (src.get("retime") or {}).get("retimed"), src
    assert src["uncertainty_ms"] >= 1000.0
    assert abs(src["offset_s"] - truth) * 1e3 <= src["uncertainty_ms"], src
    assert src["steps_not_retimed"].startswith("only a vLLM log's steps are re-timed"), src
    assert "one decode step in several" in src["steps_not_retimed"]
    from pipeline.ingest import align

    (line,) = [t for _, t in align.describe(con, ["g"])]
    assert "were NOT re-timed" in line and "give the log with sub-second stamps)" in line, line
    con.close()
    # replay compares its TTFT split with the observed one, which rests on those steps: it repeats the warning
    from ..clirun import run_cli

    limits = ("--max-num-seqs", "64", "--max-num-batched-tokens", "4096", "--kv-capacity-tokens", "200000")
    r = run_cli("replay", "g", "--db", tmp_path / "g.duckdb", *limits)
    assert r.returncode == 0, r.stderr
    assert "ingest warned: the log's steps, stamped to the second, were NOT re-timed (only a vLLM log" in r.stdout
    # and the gaps between such steps are no host time (it added 135 ms a step to every simulated one)
    assert "host gap 0 ms)" in r.stdout and "host time between steps is not known and not added" in r.stdout


@pytest.mark.long
def test_a_log_read_in_the_wrong_time_zone_is_named_as_such(tmp_path):
    """A vLLM log written in UTC read with --tz America/New_York, joined with an NTP-synced Unix
    client: the offset came out as +14403.7 s with no hint; now the line says a whole-hours offset
    between two Unix clocks is a time zone, and which zone the stamps were read in."""
    import json

    from pipeline.ingest import align
    from pipeline.sim.split import write_engine_pair

    result, *_ = _simulate("light", 3)
    truth = write_engine_pair(result, tmp_path / "server.log", tmp_path / "profile_export.jsonl")
    con = store.connect(tmp_path / "z.duckdb")
    files = [tmp_path / "server.log", tmp_path / "profile_export.jsonl"]
    ingest_paths(con, files, run_id="ny", tz="America/New_York")  # 2026-09: EDT, 4 h behind UTC
    ingest_paths(con, files, run_id="utc", tz="UTC")

    def source(run):
        q = "select json_extract(meta, '$.clock_alignment.sources[0]') from runs where run_id = ?"
        return json.loads(con.execute(q, [run]).fetchone()[0])

    ny, utc = source("ny"), source("utc")
    assert ny["offset_s"] == pytest.approx(4 * 3600 + truth, abs=0.01)
    assert ny["time_zone_suspect"] == {"hours": 4.0, "stamps_read_in": "America/New_York"}
    assert "time_zone_suspect" not in utc and utc["offset_s"] == pytest.approx(truth, abs=0.01)
    lines = dict((t.split(":", 1)[0], (p, t)) for p, t in align.describe(con, ["ny", "utc"]))
    problem, text = lines["run ny"]
    assert problem and "an offset of +4 h and a few seconds between two Unix clocks is a time zone" in text
    assert "read in America/New_York" in text and "--tz ZONE --replace" in text
    assert lines["run utc"][0] is False
