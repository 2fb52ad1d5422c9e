"""vLLM server logs with --enable-logging-iteration-details, recorded on this CPU (fixtures/vllm)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pipeline import store

from .conftest import load

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"
ITER = re.compile(
    r"Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, (\d+) generation requests, "
    r"(\d+) generation tokens, iteration elapsed time: ([0-9.]+) ms"
)


def truth(path: Path) -> list[tuple]:
    """Independent parse: the Iteration(...) lines, by a plain regex over the text."""
    return [tuple(float(x) for x in m.groups()) for m in map(ITER.search, path.read_text().splitlines()) if m]


@pytest.mark.parametrize("name", ["server.log", "server_epoch.log"])
def test_iteration_count_and_time_equal_the_log(con, name):
    steps = truth(FIX / name)
    (res,) = load(con, FIX / name)
    assert res.format == "vllm-log"
    n_lines = len((FIX / name).read_text().splitlines())
    assert (res.accepted, res.rejected, res.skipped) == (len(steps), 0, n_lines - len(steps))
    assert res.lines_read == n_lines
    got = con.execute(
        "select count(*), sum(dur_ms), sum(prefill_tokens), sum(decode_tokens) from iterations"
    ).fetchall()[0]
    want = np.array(steps)
    assert got[0] == len(steps)
    assert got[1] == pytest.approx(want[:, 5].sum(), rel=1e-12)
    assert (got[2], got[3]) == (want[:, 2].sum(), want[:, 4].sum())
    stats = con.execute("select count, p50, p99 from metric_stats where metric = 'iteration_ms'").fetchall()[0]
    assert stats[0] == len(steps)
    assert stats[2] == pytest.approx(np.percentile(want[:, 5], 99), rel=1e-9)


def test_run_metadata_from_startup_lines(con):
    load(con, FIX / "server.log")
    ver, model, dtype, clock, meta = con.execute(
        "select engine_version, model, dtype, clock, meta from runs"
    ).fetchall()[0]
    meta = json.loads(meta)
    assert (ver, model, dtype, clock) == ("0.32.0", "tiny-llama", "bfloat16", "unix")
    assert (meta["max_num_seqs"], meta["max_num_batched_tokens"], meta["kv_cache_tokens"]) == (8, 256, 2048)
    assert meta["chunked_prefill"] is True and meta["timestamps_reconstructed"] is True
    # 2048 tokens in the 16 overridden blocks: 128-token blocks, one of them vLLM's null block
    assert (meta["num_gpu_blocks"], meta["kv_block_size"], meta["kv_capacity_tokens"]) == (16, 128, 15 * 128)
    usage = np.array(con.execute("select kv_usage from iterations").fetchall(), dtype=float).ravel()
    assert np.allclose(usage * 15, np.round(usage * 15), atol=0.01)  # the log's usage counts 15 blocks


def test_kv_cache_dtype_from_the_config_line(con, tmp_path):
    """An fp8-KV server records runs.kv_dtype = fp8 (a --kv-dtype fp8 what-if on it is then a no-op)."""
    text = (FIX / "server.log").read_text()
    assert "kv_cache_dtype=auto" in text
    fp8 = tmp_path / "server_fp8.log"
    fp8.write_text(text.replace("kv_cache_dtype=auto", "kv_cache_dtype=fp8"))
    load(con, FIX / "server.log", run_id="auto")
    load(con, fp8, run_id="fp8")
    got = con.execute("select run_id, dtype, kv_dtype from runs order by run_id").fetchall()
    assert got == [("auto", "bfloat16", "auto"), ("fp8", "bfloat16", "fp8")]
    from pipeline.replay.whatif import recorded_kv_dtype

    assert [recorded_kv_dtype(kv, dt, None) for _, dt, kv in got] == [
        ("bfloat16", "runs.dtype (kv_dtype auto)"),
        ("fp8", "runs.kv_dtype"),
    ]


_V1 = (
    "INFO 11-30 04:47:06 [core.py:133] Initializing a V1 LLM engine (v0.10.1) with config: model='m', "
    "tokenizer='m', dtype=torch.bfloat16, max_seq_len=1024, quantization=None, enforce_eager=True, "
    "kv_cache_dtype={kv}, device_config=cuda, seed=0, served_model_name=m"
)
_V0 = (
    "INFO 10-17 09:12:44 llm_engine.py:237] Initializing an LLM engine (v0.6.3) with config: model='m', "
    "speculative_config=None, tokenizer='m', dtype=torch.float16, max_seq_len=4096, quantization=None, "
    "enforce_eager=False, kv_cache_dtype={kv}, quantization_param_path=None, device_config=cuda, seed=0"
)
_ARGS = "INFO 11-30 04:46:55 [api_utils.py:286] non-default args: {{'model': 'm', 'dtype': 'half'{kv}}}"


@pytest.mark.parametrize(
    "lines, want",
    [
        ([_V1.format(kv="fp8")], ("bfloat16", "fp8")),
        ([_V1.format(kv="auto")], ("bfloat16", "auto")),
        ([_V0.format(kv="fp8_e5m2")], ("float16", "fp8_e5m2")),  # a V0 engine (v0.6) prints "an LLM engine"
        ([_ARGS.format(kv=", 'kv_cache_dtype': 'fp8_e4m3'")], ("half", "fp8_e4m3")),  # no config line
        ([_ARGS.format(kv="")], ("half", None)),  # the default KV dtype is not a non-default arg
        ([_ARGS.format(kv=", 'kv_cache_dtype': 'fp8'"), _V1.format(kv="fp8")], ("bfloat16", "fp8")),
    ],
)
def test_dtype_and_kv_dtype_of_each_startup_format(lines, want):
    from pipeline.ingest.engines.vllm_log import _meta

    info = _meta(pl.DataFrame({"raw": lines, "text": lines}))
    assert (info["dtype"], info["kv_dtype"]) == want


@pytest.mark.parametrize(
    "args, want",
    [
        ({"kv_cache_tokens": 41408, "kv_block_size": 16}, (2588, 16, 2587 * 16)),  # block_size argument
        ({"kv_cache_tokens": 2048, "num_gpu_blocks": 16}, (16, 128, 1920)),  # override: size = tokens / blocks
        ({"kv_cache_tokens": 41408}, None),  # a GPU log without either: block size unknown, nothing derived
    ],
)
def test_kv_blocks_derivation(args, want):
    from pipeline.ingest.engines.vllm_log import _kv_blocks

    meta = dict(args)
    _kv_blocks(meta, None)
    got = (meta.get("num_gpu_blocks"), meta.get("kv_block_size"), meta.get("kv_capacity_tokens"))
    assert got == (want or (None, None, None))


def test_one_second_stamps_rebuild_the_timeline(con):
    """The default 1-s log, rebuilt, against the same records' epoch stamps (µs) from the same run."""
    load(con, FIX / "server.log", run_id="coarse")
    load(con, FIX / "server_epoch.log", run_id="fine")
    err = np.array(
        con.execute(
            "select a.t_end - b.t_end from iterations a join iterations b using (iter) "
            "where a.run_id = 'coarse' and b.run_id = 'fine' order by iter"
        ).fetchall()
    ).ravel()
    assert len(err) == len(truth(FIX / "server.log"))
    assert np.abs(err).max() < 1.0
    assert np.median(np.abs(err)) < 0.25
    ends = np.array(
        con.execute("select t_start, t_end from iterations where run_id = 'coarse' order by iter").fetchall()
    )
    assert (np.diff(ends[:, 1]) > 0).all() and (
        ends[1:, 0] >= ends[:-1, 1] - 1e-6
    ).all()  # no overlap (float64 at 1.8e9 s: ~0.2 µs)
    fine = json.loads(con.execute("select meta from runs where run_id = 'fine'").fetchall()[0][0])
    assert fine["timestamps_reconstructed"] is False and fine["timestamp_resolution_s"] == pytest.approx(1e-6)


LINE = (
    "Iteration(7): 1 context requests, 255 context tokens, 1 generation requests, 1 generation tokens, "
    "iteration elapsed time: 16.31 ms, CPU KV cache usage: 33.3%"
)


@pytest.mark.parametrize(
    "prefix, t_end",
    [
        ("(APIServer pid=3646) INFO 05-19 10:13:11 [loggers.py:199] Engine 000: ", None),
        (
            "2026-05-12T08:01:39.331095044Z (APIServer pid=1) INFO 05-12 08:01:39 [loggers.py:199] Engine 000: ",
            1778572899.331095,
        ),
        ("1796013811.091940 INFO [loggers.py:199] Engine 000: ", 1796013811.09194),
        ("[2025-01-02 03:04:05,250] INFO ", 1735787045.25),
    ],
)
def test_prefixes(con, tmp_path, prefix, t_end):
    path = tmp_path / "x.log"
    path.write_text("some start-up line\n" + prefix + LINE + "\n")
    (res,) = load(con, path)
    assert (res.format, res.accepted, res.skipped) == ("vllm-log", 1, 1)
    row = con.execute(
        "select iter, prefill_reqs, prefill_tokens, decode_reqs, decode_tokens, dur_ms, kv_usage, t_end from iterations"
    ).fetchall()[0]
    assert row[:7] == (7, 1, 255, 1, 1, 16.31, pytest.approx(0.333))
    if t_end is not None:
        assert row[7] == pytest.approx(t_end, abs=1e-6)
    else:  # year-less, whole second: reconstructed inside its second
        sec = np.datetime64(
            f"{con.execute('select meta->>$k from runs', {'k': '$.assumed_year'}).fetchall()[0][0]}-05-19T10:13:11"
        )
        assert 0 <= row[7] - sec.astype("datetime64[s]").astype(float) <= 1


def test_broken_lines_are_rejects_other_lines_skipped(con, tmp_path):
    lines = (FIX / "server_epoch.log").read_text().splitlines()
    idx = [i for i, l in enumerate(lines) if "Iteration(" in l]
    lines[idx[5]] = lines[idx[5]].split("iteration elapsed time")[0]  # truncated
    lines[idx[6]] = (
        lines[idx[6]].replace(" 0 generation requests,", "").replace(" 1 generation requests,", "")
    )  # field lost
    lines[idx[7]], lines[idx[8]] = lines[idx[8]], lines[idx[7]]  # reordered
    lines.insert(idx[9], lines[idx[9]])  # duplicated
    path = tmp_path / "broken.log"
    path.write_text("\n".join(lines) + "\n")
    (res,) = load(con, path)
    rej = dict(con.execute("select line_no, reason from rejects").fetchall())
    assert rej[idx[5] + 1] == "vLLM Iteration line without dur_ms"
    assert rej[idx[6] + 1] == "vLLM Iteration line without decode_reqs"
    assert rej[idx[9] + 2].startswith("duplicate iter")
    assert len(rej) == 3
    assert res.lines_read == res.accepted + res.rejected + res.skipped
    assert con.execute("select count(*) from iterations").fetchall()[0][0] == len(idx) - 2


@pytest.mark.parametrize("keep", [11, 16])  # cut inside the counter, or after "Iteration(40): "
def test_two_step_lines_run_together_are_one_reject(con, tmp_path, keep):
    """A line cut short with the next written on it: read as one step, it gave one step the other's
    numbers (or the first step's counter the second's fields) and lost a step without a word."""
    lines = (FIX / "server_epoch.log").read_text().splitlines()
    idx = [i for i, l in enumerate(lines) if "Iteration(" in l]
    a, b = idx[40], idx[41]
    assert b == a + 1
    glued = lines[a][: lines[a].index("Iteration(") + keep] + lines[b]
    assert glued.count("Iteration(") == 2
    lines[a : b + 1] = [glued]
    path = tmp_path / "glued.log"
    path.write_text("\n".join(lines) + "\n")
    (res,) = load(con, path)
    rej = con.execute("select line_no, reason from rejects").fetchall()
    assert rej == [
        (a + 1, "two Iteration lines run together (a line cut short with the next written on it): neither is read")
    ]
    assert res.lines_read == res.accepted + res.rejected + res.skipped
    assert con.execute("select count(*) from iterations").fetchall()[0][0] == len(idx) - 2


@pytest.mark.long
def test_output_slices_give_the_same_store(con, tmp_path, monkeypatch):
    from pipeline.ingest.engines import vllm_log

    log = FIX / "server.log"
    (whole,) = load(con, log)
    q = "select iter, t_start, t_end, dur_ms, prefill_tokens, decode_tokens from iterations order by iter"
    expect = con.execute(q).fetchall()
    monkeypatch.setattr(vllm_log, "OUT_BATCH_ROWS", 50)  # the 532 steps in 11 slices
    other = store.connect(tmp_path / "sliced.duckdb")
    (sliced,) = load(other, log)
    assert (sliced.lines_read, sliced.accepted, sliced.skipped) == (whole.lines_read, whole.accepted, whole.skipped)
    assert other.execute(q).fetchall() == expect and len(expect) == 532
    assert other.execute("select count(*) from runs").fetchall() == [(1,)]


def _two_engine_log(tmp_path: Path) -> tuple[Path, list[tuple], list[tuple]]:
    """The recorded log with a second data-parallel engine: every step line repeated as
    ``Engine 001`` with a different elapsed time, interleaved line by line."""
    out = []
    for line in (FIX / "server.log").read_text().splitlines():
        out.append(line)
        if ITER.search(line):
            out.append(
                re.sub(
                    r"elapsed time: ([0-9.]+) ms",
                    lambda m: f"elapsed time: {float(m.group(1)) * 0.5:.2f} ms",
                    line.replace("Engine 000:", "Engine 001:"),
                )
            )
    path = tmp_path / "dp.log"
    path.write_text("\n".join(out) + "\n")
    text = path.read_text().splitlines()
    e0 = [tuple(float(x) for x in ITER.search(ln).groups()) for ln in text if "Engine 000:" in ln and ITER.search(ln)]
    e1 = [tuple(float(x) for x in ITER.search(ln).groups()) for ln in text if "Engine 001:" in ln and ITER.search(ln)]
    return path, e0, e1


@pytest.mark.parametrize("run_id", [None, "prod"])
@pytest.mark.long
def test_data_parallel_engines_become_runs(con, tmp_path, run_id):
    path, e0, e1 = _two_engine_log(tmp_path)
    (res,) = load(con, path, run_id=run_id)
    base = run_id or "dp"
    assert res.rejected == 0 and res.accepted == len(e0) + len(e1)
    assert res.lines_read == len(path.read_text().splitlines())  # the run records made up per engine are not lines
    assert res.run_ids == [f"{base}-engine000", f"{base}-engine001"]
    for k, steps in enumerate((e0, e1)):
        rid = f"{base}-engine{k:03d}"
        n, dur, last_iter = con.execute(
            "select count(*), sum(dur_ms), max(iter) from iterations where run_id = ?", [rid]
        ).fetchall()[0]
        assert n == len(steps) and last_iter == max(s[0] for s in steps)
        assert dur == pytest.approx(sum(s[5] for s in steps), rel=1e-12)
        # each engine's rebuilt timeline is its own: steps never overlap within a run
        t = np.array(
            con.execute("select t_start, t_end from iterations where run_id = ? order by iter", [rid]).fetchall()
        )
        assert np.all(t[1:, 0] >= t[:-1, 1] - 1e-6)  # float64 at 1.8e9 s: ~0.2 us
        meta = json.loads(con.execute("select meta from runs where run_id = ?", [rid]).fetchall()[0][0])
        assert (meta["dp_engine_index"], meta["dp_engines"], meta["max_num_seqs"]) == (k, 2, 8)
    # engine 001's timeline is the one its lines give on their own (not one shared with engine 000)
    alone = tmp_path / "alone.log"
    alone.write_text("\n".join(ln for ln in path.read_text().splitlines() if "Engine 000: Iteration" not in ln) + "\n")
    load(con, alone, run_id="alone")
    diff = con.execute(
        "select max(abs(a.t_end - b.t_end)), count(*) from iterations a join iterations b using (iter) "
        "where a.run_id = 'alone' and b.run_id = ?",
        [f"{base}-engine001"],
    ).fetchall()[0]
    assert diff == (0.0, len(e1))


@pytest.mark.parametrize("batch_bytes", [None, 4096])  # 4 KiB: the step before the bad one is in another batch
@pytest.mark.parametrize("name", ["server.log", "server_epoch.log"])
@pytest.mark.long
def test_absurd_elapsed_time_is_rejected_and_moves_no_other_step(con, tmp_path, monkeypatch, name, batch_bytes):
    from pipeline.ingest import reader

    if batch_bytes:
        monkeypatch.setattr(reader, "BATCH_BYTES", batch_bytes)
    lines = (FIX / name).read_text().splitlines()
    idx = [i for i, line in enumerate(lines) if ITER.search(line)]
    k = idx[100]
    without = tmp_path / "without" / name
    without.parent.mkdir()
    without.write_text("\n".join(lines[:k] + lines[k + 1 :]) + "\n")  # the step's line left out altogether
    lines[k] = re.sub(r"elapsed time: [0-9.]+ ms", "elapsed time: 999999.00 ms", lines[k])
    bad = tmp_path / name
    bad.write_text("\n".join(lines) + "\n")
    (res,) = load(con, bad)
    assert (res.accepted, res.rejected) == (len(idx) - 1, 1)
    ((line_no, reason),) = con.execute("select line_no, reason from rejects").fetchall()
    assert line_no == k + 1 and reason.startswith("iteration elapsed time 999999.0 ms is longer than")
    q = "select iter, t_start, t_end from iterations order by iter"
    got = con.execute(q).fetchall()
    other = store.connect(tmp_path / "without.duckdb")
    load(other, without)
    assert got == other.execute(q).fetchall()  # every other step exactly where it is without the line
    assert got[-1][2] - got[0][1] < 10  # the run still lasts seconds (was 1005 s)


def test_three_generations_of_the_iteration_line(tmp_path):
    """The EngineCore line (no KV usage), the DP dummy step, and the current frontend line
    (APIServer prefix, loggers.py, optional encoder fields, a trailing ' (dummy)')."""
    from pipeline import store
    from pipeline.ingest import ingest_paths

    lines = [
        "(EngineCore_DP0 pid=2010410) INFO 12-22 21:44:40 [core.py:349] Iteration(515): 0 context requests, "
        "0 context tokens, 20 generation requests, 20 generation tokens, iteration elapsed time: 10.99 ms",
        "(EngineCore_DP0 pid=2010410) INFO 12-22 21:44:40 [core.py:349] Iteration(516): 0 context requests, "
        "0 context tokens, 0 generation requests, 0 generation tokens, iteration elapsed time: 1.25 ms (dummy)",
        "(APIServer pid=77) INFO 12-22 21:44:41 [loggers.py:231] Engine 000: Iteration(517): 2 context requests, "
        "4096 context tokens, 6 generation requests, 6 generation tokens, iteration elapsed time: 18.42 ms, "
        "GPU KV cache usage: 37.1%, encoder inputs: 4, encoder output embeddings: 3520",
        "(APIServer pid=77) INFO 12-22 21:44:41 [loggers.py:231] Engine 000: Iteration(518): 0 context requests, "
        "0 context tokens, 0 generation requests, 0 generation tokens, iteration elapsed time: 2.00 ms, "
        "GPU KV cache usage: 37.1% (dummy)",
        # a multimodal dummy step (encoder fields, then the mark) and another device's KV label
        "(APIServer pid=77) INFO 12-22 21:44:42 [loggers.py:231] Engine 000: Iteration(519): 0 context requests, "
        "0 context tokens, 0 generation requests, 0 generation tokens, iteration elapsed time: 3.10 ms, "
        "GPU KV cache usage: 37.1%, encoder inputs: 0, encoder output embeddings: 0 (dummy)",
        "(APIServer pid=77) INFO 12-22 21:44:42 [loggers.py:231] Engine 000: Iteration(520): 0 context requests, "
        "0 context tokens, 3 generation requests, 3 generation tokens, iteration elapsed time: 9.50 ms, "
        "XPU KV cache usage: 12.5%",
        # the mark right after the time, before the KV field
        "(APIServer pid=77) INFO 12-22 21:44:43 [loggers.py:231] Engine 000: Iteration(521): 0 context requests, "
        "0 context tokens, 0 generation requests, 0 generation tokens, iteration elapsed time: 1.75 ms (dummy), "
        "GPU KV cache usage: 12.5%",
    ]
    p = tmp_path / "gen.log"
    p.write_text("\n".join(lines) + "\n")
    con = store.connect(tmp_path / "g.duckdb")
    res = ingest_paths(con, [p], run_id="g")[0]
    assert (res.accepted, res.rejected) == (7, 0)
    rows = con.execute(
        "select iter, prefill_tokens, decode_tokens, dur_ms, kv_usage, "
        "json_extract(extra, '$.is_dummy')::boolean from iterations order by iter"
    ).fetchall()
    assert rows == [
        (515, 0, 20, 10.99, None, False),
        (516, 0, 0, 1.25, None, True),
        (517, 4096, 6, 18.42, pytest.approx(0.371), False),
        (518, 0, 0, 2.0, pytest.approx(0.371), True),
        (519, 0, 0, 3.1, pytest.approx(0.371), True),
        (520, 0, 3, 9.5, pytest.approx(0.125), False),
        (521, 0, 0, 1.75, pytest.approx(0.125), True),
    ]
    scope = json.loads(con.execute("select meta from runs where run_id = 'g'").fetchall()[0][0])["elapsed_time_scope"]
    assert "waiting for the executor" in scope  # the report must say what the elapsed time is


def _utc(text: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.timezone.utc).timestamp()


def test_year_less_stamps_lie_before_the_file_was_written(tmp_path):
    """vLLM's default stamps have no year: each takes the latest year that puts it before the
    file's modification time. A log of 30 Nov read after New Year stays in the old year (it was
    put eleven months after the file was written), and a log over midnight of 31 Dec keeps its
    order (the first step of the new year was rejected as a year before the one it follows)."""
    import datetime as dt
    import os
    import shutil

    def ingest_copy(name: str, text: str | None, written: str):
        path = tmp_path / name
        if text is None:
            shutil.copy(FIX / "server.log", path)
        else:
            path.write_text(text)
        os.utime(path, (_utc(written), _utc(written)))
        con = store.connect(tmp_path / f"{name}.duckdb")
        (res,) = load(con, path, tz="UTC")
        t = con.execute("select t_end from iterations order by iter").fetchnumpy()["t_end"]
        year = con.execute("select meta->>'$.assumed_year' from runs").fetchone()[0]
        return res, t, int(year)

    same, t_same, y_same = ingest_copy("same.log", None, "2026-11-30T05:00:00")
    late, t_late, y_late = ingest_copy("late.log", None, "2027-01-02T00:00:00")
    assert y_same == y_late == 2026 and late.accepted == same.accepted
    np.testing.assert_allclose(t_late, t_same, atol=1e-6)
    assert _utc("2026-11-30T04:47:00") < t_same.min() < _utc("2026-11-30T04:48:00")

    # the same log moved to straddle midnight of New Year's Eve (its steps run 04:47:27-32): 04:47:30 becomes 00:00:00
    shift = dt.datetime(2027, 1, 1) - dt.datetime(2026, 11, 30, 4, 47, 30)

    def moved(m: re.Match) -> str:
        t = dt.datetime.strptime(f"2026-{m.group(1)}", "%Y-%m-%d %H:%M:%S") + shift
        return t.strftime("%m-%d %H:%M:%S")

    text = re.sub(r"(?<=INFO )(\d\d-\d\d \d\d:\d\d:\d\d)", moved, (FIX / "server.log").read_text())
    steps = [line for line in text.splitlines() if "Iteration(" in line]
    assert any("INFO 12-31 23:59:" in x for x in steps) and any("INFO 01-01 00:00:" in x for x in steps)
    ny, t_ny, y_ny = ingest_copy("newyear.log", text, "2027-01-01T00:01:00")
    assert (ny.accepted, ny.rejected) == (same.accepted, same.rejected) and y_ny == 2026
    np.testing.assert_allclose(t_ny - t_same, shift.total_seconds(), atol=1e-6)


@pytest.mark.parametrize("written, year", [("2024-03-01T00:00:00", 2024), ("2025-03-01T00:00:00", 2024)])
def test_a_log_of_29_february_keeps_its_steps(tmp_path, written, year):
    """29 February is a date of leap years only: read in a later year its stamps got no time at all
    (every step rejected "without timestamp"); now they take the latest leap year before the file
    was written."""
    import datetime as dt
    import os

    log = tmp_path / "leap.log"
    log.write_text((FIX / "server.log").read_text().replace("INFO 11-30 ", "INFO 02-29 "))
    os.utime(log, (_utc(written), _utc(written)))
    con = store.connect(tmp_path / "leap.duckdb")
    (res,) = load(con, log, tz="UTC")
    assert (res.accepted, res.rejected) == (532, 0)
    first = con.execute("select min(t_end) from iterations").fetchone()[0]
    assert dt.datetime.fromtimestamp(first, dt.timezone.utc).strftime("%Y-%m-%d %H:%M") == f"{year}-02-29 04:47"


_LOG_PREFIX = re.compile(r"^(.*?)(DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d-\d\d \d\d:\d\d:\d\d) (\[[^\]]*\])")


def _coloured(line: str) -> str:
    """A line as vLLM's ColoredFormatter writes it to a terminal (``docker run -t``): the level,
    the time and ``[file:line]`` wrapped in ANSI SGR codes."""
    return _LOG_PREFIX.sub(
        lambda m: f"{m[1]}\x1b[32m{m[2]}\x1b[0m \x1b[90m{m[3]}\x1b[0m \x1b[90m{m[4]}\x1b[0m", line, count=1
    )


def test_coloured_log_reads_as_the_plain_one(tmp_path):
    """Every step line of a coloured log was rejected "without timestamp" (the codes sit
    between the level and the date); now the codes are stripped before the fields are read,
    and the steps, timeline and run facts equal the plain log's. A reject keeps its line as written."""
    import os

    lines = (FIX / "server.log").read_text().splitlines()[:130]
    idx = [i for i, line in enumerate(lines) if ITER.search(line)]
    lines[idx[3]] = lines[idx[3]].split(", iteration elapsed time")[0]  # one truncated step: a reject
    coloured = [_coloured(line) for line in lines]
    assert sum("\x1b[32mINFO\x1b[0m \x1b[90m11-30 " in line for line in coloured) > len(idx)
    got = {}
    for name, text in (("plain", lines), ("coloured", coloured)):
        path = tmp_path / f"{name}.log"
        path.write_text("\n".join(text) + "\n")
        os.utime(path, (_utc("2026-11-30T05:00:00"), _utc("2026-11-30T05:00:00")))
        con = store.connect(tmp_path / f"{name}.duckdb")
        (res,) = load(con, path, tz="UTC")  # the format detected, not named
        got[name] = (
            (res.format, res.accepted, res.rejected, res.skipped),
            con.execute(
                "select iter, t_start, t_end, dur_ms, prefill_tokens, decode_tokens, kv_usage from iterations order by iter"
            ).fetchall(),
            con.execute("select engine_version, model, dtype, meta->>'$.max_num_seqs' from runs").fetchall(),
            con.execute("select line_no, reason, raw from rejects").fetchall(),
        )
    plain, col = got["plain"], got["coloured"]
    assert col[0] == plain[0] == ("vllm-log", len(idx) - 1, 1, 130 - len(idx))
    assert col[1] == plain[1] and len(col[1]) == 49
    assert sum(r[3] for r in col[1]) == pytest.approx(sum(float(ITER.search(lines[i])[6]) for i in idx if i != idx[3]))
    assert col[2] == plain[2] == [("0.32.0", "tiny-llama", "bfloat16", "8")]
    ((line_no, reason, raw),) = col[3]
    assert (line_no, reason) == (idx[3] + 1, "vLLM Iteration line without dur_ms") == plain[3][0][:2]
    assert raw == coloured[idx[3]] and raw.startswith("\x1b[32mINFO\x1b[0m")


_FRONT_END = re.compile(
    r"^(INFO \d\d-\d\d \d\d:\d\d:\d\d) \[loggers\.py:\d+\] Engine 000: (.*? ms), CPU KV cache usage: .*$"
)


def test_engine_core_data_parallel_ranks_become_runs(con, tmp_path):
    """The older EngineCore line names its data-parallel rank in the process prefix
    (``(EngineCore_DP1 pid=N)``), not ``Engine 001:``: DP1's steps were rejected as duplicate
    iters of DP0's run. Now each rank is a run, as with the front-end line; a ``(dummy)``
    step keeps its mark."""
    out, steps = [], {0: [], 1: []}
    for line in (FIX / "server.log").read_text().splitlines():
        m = _FRONT_END.match(line)
        if not m:
            out.append(line)
            continue
        for rank, pid, scale in ((0, 2010410, 1.0), (1, 2010411, 0.5)):
            body = re.sub(r"elapsed time: ([0-9.]+) ms", lambda e: f"elapsed time: {float(e[1]) * scale:.2f} ms", m[2])
            if rank == 1 and int(ITER.search(body)[1]) % 10 == 3:
                body += " (dummy)"
            out.append(f"(EngineCore_DP{rank} pid={pid}) {m[1]} [core.py:349] {body}")
            steps[rank].append(tuple(float(x) for x in ITER.search(body).groups()))
    assert len(steps[0]) == len(steps[1]) == 532
    path = tmp_path / "dp.log"
    path.write_text("\n".join(out) + "\n")
    (res,) = load(con, path)
    assert (res.format, res.accepted, res.rejected) == ("vllm-log", 2 * 532, 0)
    assert res.run_ids == ["dp-engine000", "dp-engine001"]
    for rank in (0, 1):
        rid = f"dp-engine{rank:03d}"
        n, dur, last, dummies, idx = con.execute(
            "select count(*), sum(dur_ms), max(iter), count(*) filter (json_extract(extra, '$.is_dummy')::boolean), "
            "min(extra->>'$.engine_index') from iterations where run_id = ?",
            [rid],
        ).fetchall()[0]
        assert (n, last, idx) == (532, max(s[0] for s in steps[rank]), str(rank))
        assert dur == pytest.approx(sum(s[5] for s in steps[rank]), rel=1e-12)
        assert dummies == (0 if rank == 0 else sum(1 for s in steps[1] if s[0] % 10 == 3))
        meta = json.loads(con.execute("select meta from runs where run_id = ?", [rid]).fetchall()[0][0])
        assert (meta["dp_engine_index"], meta["dp_engines"]) == (rank, 2)


_PROBE = 'INFO:     127.0.0.1:40312 - "GET /health HTTP/1.1" 200 OK'


@pytest.mark.parametrize(
    "banner, version",
    [
        ("INFO 11-30 04:46:55 [api_utils.py:347] vLLM server version 0.32.0, serving model /m", "0.32.0"),
        ("1796014015.682722 INFO [api_utils.py:347] vLLM server version 0.32.0, serving model /m", "0.32.0"),
        ("(APIServer pid=1017428) INFO 05-14 09:09:58 [api_server.py:1272] vLLM API server version 0.14.1", "0.14.1"),
        ("INFO 11-27 02:01:37 api_server.py:585] vLLM API server version 0.6.4.post1", "0.6.4.post1"),
        (
            "(APIServer pid=460954) INFO 12-18 06:01:05 [api_server.py:1945] Starting vLLM API server 0 on http://0.0.0.0:8080",
            None,
        ),
        ("INFO 03-27 23:19:15 api_server.py:958] Starting vLLM API server on http://0.0.0.0:8000", None),
        ("INFO 11-30 04:47:16 [entry.py:140] Starting vLLM server on http://0.0.0.0:8123", None),
        ("\x1b[32mINFO\x1b[0m \x1b[90m11-30 04:46:55\x1b[0m [api_utils.py:347] vLLM server version 0.32.0", "0.32.0"),
    ],
)
def test_first_step_past_the_detection_head_is_known_by_the_banner(con, tmp_path, banner, version):
    """Detection reads the first 64 KiB; a log whose first step line comes after 64 KiB of
    start-up and health-probe lines was "unknown format". vLLM's start-up banner there now
    says it is a vLLM log."""
    steps = [line for line in (FIX / "server.log").read_text().splitlines() if ITER.search(line)]
    path = tmp_path / "late.log"
    path.write_text("\n".join([banner] + [_PROBE] * 1500 + steps) + "\n")
    assert (path.read_text().index("Iteration(")) > 1 << 16
    (res,) = load(con, path)
    assert (res.format, res.accepted, res.rejected, res.skipped) == ("vllm-log", 532, 0, 1501)
    got = con.execute("select count(*), sum(dur_ms) from iterations").fetchall()[0]
    assert got == (532, pytest.approx(sum(float(ITER.search(s)[6]) for s in steps), rel=1e-12))
    assert con.execute("select engine_version from runs").fetchall() == [(version,)]


@pytest.mark.parametrize(
    "first",
    [
        "Notes: the server printed vLLM server version 0.32.0 at start-up",  # quoted, no log line
        "INFO 11-30 04:46:55 [api_utils.py:347] SGLang server version 0.5.0",  # not vLLM's banner
    ],
)
def test_banner_words_outside_a_vllm_log_line_are_no_vllm_log(con, tmp_path, first):
    from pipeline.errors import InputError

    path = tmp_path / "notes.txt"
    path.write_text("\n".join([first] + [_PROBE] * 1500) + "\n")
    with pytest.raises(InputError, match="unknown format"):
        load(con, path)


def test_vllm_log_without_steps_says_how_to_get_them(con, tmp_path):
    """Known by its banner, a log of a server started without --enable-logging-iteration-details
    is a vLLM log with no records (and the hint), not "unknown format"."""
    path = tmp_path / "plain.log"
    path.write_text(
        "\n".join(ln for ln in (FIX / "server.log").read_text().splitlines() if "Iteration(" not in ln) + "\n"
    )
    (res,) = load(con, path)
    assert (res.format, res.accepted, res.rejected, res.skipped) == ("vllm-log", 0, 0, 639 - 532)
    assert "--enable-logging-iteration-details" in res.line()
