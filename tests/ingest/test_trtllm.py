"""TensorRT-LLM IterationStats: dict-repr iteration logs and /metrics JSON arrays."""

from __future__ import annotations

import ast
import datetime as dt
import json
from pathlib import Path

import pytest


from .conftest import load

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "trtllm"
COLS = "iter, dur_ms, t_end, prefill_reqs, prefill_tokens, decode_reqs, decode_tokens, running_reqs, waiting_reqs, kv_usage, preempted_reqs, context_tokens"


def expected(rec: dict) -> tuple:
    """Hand mapping of one IterationStats record (docs/formats.md), written independently of the SQL."""
    ib, kv = rec["inflightBatchingStats"], rec["kvCacheStats"]
    ts = dt.datetime.strptime(rec["timestamp"], "%m-%d-%Y %H:%M:%S.%f").replace(tzinfo=dt.timezone.utc).timestamp()
    flat = "scheduledNumDecodeRequests" in rec
    dec = rec["scheduledNumDecodeRequests"] if flat else ib["numGenRequests"]
    pre_r = rec["scheduledNumPrefillRequests"] if flat else ib["numContextRequests"]
    pre_t = rec["scheduledSumPrefillTokens"] if flat else ib["numCtxTokens"]
    waiting = rec["queuedNumPrefillRequests"] + rec["queuedNumDecodeRequests"] if flat else rec["numQueuedRequests"]
    ctx = rec["scheduledSumPrefillKvTokens"] + rec["scheduledSumDecodeKvTokens"] if flat else None
    return (
        rec["iter"],
        rec["iterLatencyMS"],
        pytest.approx(ts, abs=1e-6),
        pre_r,
        pre_t,
        dec,
        dec,
        rec["numActiveRequests"],
        waiting,
        pytest.approx(kv["usedNumBlocks"] / kv["maxNumBlocks"]),
        ib["numPausedRequests"],
        ctx,
    )


def test_iteration_log_dict_repr(con):
    path = FIX / "iteration_log.txt"
    (res,) = load(con, path)
    assert (res.format, res.accepted, res.rejected) == ("trtllm-iterlog", 6, 0)
    recs = [ast.literal_eval(l) for l in path.read_text().splitlines()]
    assert con.execute(f"select {COLS} from iterations order by iter").fetchall() == [expected(r) for r in recs]
    meta = json.loads(con.execute("select meta from runs").fetchall()[0][0])
    assert (meta["max_num_seqs"], meta["max_num_batched_tokens"], meta["kv_cache_tokens"]) == (64, 8192, 101256 * 32)


def test_metrics_json_array_with_flat_fields(con):
    path = FIX / "metrics.json"
    (res,) = load(con, path)
    assert (res.format, res.accepted, res.rejected) == ("trtllm-iterlog", 4, 0)
    recs = json.loads(path.read_text())
    assert con.execute(f"select {COLS} from iterations order by iter").fetchall() == [expected(r) for r in recs]


def test_json_lines_and_broken_lines(con, tmp_path):
    recs = json.loads((FIX / "metrics.json").read_text())
    lines = [json.dumps(r) for r in recs]
    lines[1] = lines[1][:80]  # truncated
    bad = dict(recs[2])
    bad.pop("iterLatencyMS")
    lines[2] = json.dumps(bad)  # field missing
    lines.append('{"end": true}')  # the writer's end marker
    odd = {**recs[3], "iter": 9, "note": "don't"}  # a quote inside a string:
    lines.append(repr(odd))  # only literal_eval reads it
    lines.append("{'iter': 10, 'iterLatencyMS': 1.0, 'timestamp': '13-45-2024 99:00:00'}")
    path = tmp_path / "stats.jsonl"
    path.write_text("\n".join(lines) + "\n")
    (res,) = load(con, path)
    rej = dict(con.execute("select line_no, reason from rejects").fetchall())
    assert rej == {
        2: "not a TRT-LLM IterationStats record (invalid JSON or Python literal; truncated?)",
        3: "IterationStats without iterLatencyMS",
        7: "timestamp not in %m-%d-%Y %H:%M:%S[.%f] form: 13-45-2024 99:00:00",
    }
    assert sorted(r[0] for r in con.execute("select iter from iterations").fetchall()) == [0, 3, 9]
    assert res.skipped == 1 and res.lines_read == res.accepted + res.rejected + res.skipped


@pytest.mark.long
def test_local_stamps_are_read_in_the_given_zone(tmp_path):
    """The iteration log's stamps are the writer's local time: --tz moves them by the zone's
    offset on that date (zoneinfo, an independent computation), and the run says which zone."""
    import datetime as dt
    import json
    import zoneinfo

    from pipeline import store
    from pipeline.ingest import ingest_paths

    src = Path(__file__).resolve().parents[2] / "fixtures" / "trtllm" / "iteration_log.txt"
    ends = {}
    for tz in ("UTC", "Asia/Kolkata"):
        con = store.connect(tmp_path / f"{tz.replace('/', '_')}.duckdb")
        ingest_paths(con, [src], run_id="t", tz=tz)
        ends[tz] = con.execute("select t_end from iterations order by iter").fetchnumpy()["t_end"]
        meta = json.loads(con.execute("select meta from runs").fetchone()[0])
        assert meta["timestamps_time_zone"] == tz
    first = dt.datetime.fromtimestamp(float(ends["UTC"][0]), dt.timezone.utc).replace(tzinfo=None)
    shift = zoneinfo.ZoneInfo("Asia/Kolkata").utcoffset(first).total_seconds()
    assert list(ends["UTC"] - ends["Asia/Kolkata"]) == [shift] * len(ends["UTC"])


@pytest.mark.parametrize("batch_bytes", [None, 1500])
@pytest.mark.long
def test_a_record_stamped_behind_an_earlier_one_is_rejected(con, tmp_path, monkeypatch, batch_bytes):
    """A spliced log (a later piece pasted in with new counters but older stamps) ran the
    timeline backwards and was accepted as written; vLLM and SGLang logs reject such lines.
    Also across batches of lines (1500 bytes: about one record a batch)."""
    if batch_bytes:
        from pipeline.ingest import reader

        monkeypatch.setattr(reader, "BATCH_BYTES", batch_bytes)
    recs = [ast.literal_eval(line) for line in (FIX / "iteration_log.txt").read_text().splitlines()]
    stamp = dt.datetime.strptime(recs[1]["timestamp"], "%m-%d-%Y %H:%M:%S.%f")
    back = {**recs[1], "iter": 6, "timestamp": (stamp - dt.timedelta(seconds=5)).strftime("%m-%d-%Y %H:%M:%S.%f")}
    lines = [repr(r) for r in recs[:4]] + [repr(back)] + [repr(r) for r in recs[4:]]
    path = tmp_path / "iteration_log.txt"
    path.write_text("\n".join(lines) + "\n")
    (res,) = load(con, path)
    assert (res.accepted, res.rejected) == (6, 1)
    ((line_no, reason),) = con.execute("select line_no, reason from rejects").fetchall()
    behind = dt.datetime.strptime(recs[3]["timestamp"], "%m-%d-%Y %H:%M:%S.%f") - (stamp - dt.timedelta(seconds=5))
    assert line_no == 5 and reason.startswith(f"IterationStats record stamped {behind.total_seconds():.3f} s before")
    assert sorted(r[0] for r in con.execute("select iter from iterations").fetchall()) == [0, 1, 2, 3, 4, 5]
    # stamps that tie are in order (second-resolution stamps repeat)
    tie = {**recs[3], "iter": 7}
    path.write_text("\n".join([repr(r) for r in recs[:4]] + [repr(tie)]) + "\n")
    from pipeline import store

    con2 = store.connect(tmp_path / "tie.duckdb")
    (res,) = load(con2, path)
    assert (res.accepted, res.rejected) == (5, 0)


@pytest.mark.parametrize("batch_bytes", [None, 1500])
@pytest.mark.parametrize("ahead", [dt.timedelta(hours=1), dt.timedelta(days=366)])
@pytest.mark.long
def test_one_record_stamped_ahead_is_the_one_rejected(con, tmp_path, monkeypatch, ahead, batch_bytes):
    """A corrupted stamp an hour (or a year) ahead made every later record 'behind' it: 5 of 6
    rejected.  The record ahead of both neighbours, which are in order without it, is the one.
    Also when it ends a batch of lines (1500 bytes: about one record a batch): its next neighbour
    is then in the next batch, and every record after it was rejected again."""
    if batch_bytes:
        from pipeline.ingest import reader

        monkeypatch.setattr(reader, "BATCH_BYTES", batch_bytes)
    recs = [ast.literal_eval(line) for line in (FIX / "iteration_log.txt").read_text().splitlines()]
    stamp = dt.datetime.strptime(recs[2]["timestamp"], "%m-%d-%Y %H:%M:%S.%f")
    recs[2] = {**recs[2], "timestamp": (stamp + ahead).strftime("%m-%d-%Y %H:%M:%S.%f")}
    path = tmp_path / "iteration_log.txt"
    path.write_text("\n".join(repr(r) for r in recs) + "\n")
    (res,) = load(con, path)
    assert (res.accepted, res.rejected, res.lines_read) == (5, 1, 6)
    ((line_no, reason),) = con.execute("select line_no, reason from rejects").fetchall()
    assert line_no == 3 and "after a record that follows it" in reason and "corrupted stamp" in reason
    assert sorted(r[0] for r in con.execute("select iter from iterations").fetchall()) == [0, 1, 3, 4, 5]


def _tiled(n: int) -> list[dict]:
    """``n`` records from the fixture's, iter 0..n-1, stamped 50 ms apart."""
    base = [ast.literal_eval(line) for line in (FIX / "iteration_log.txt").read_text().splitlines()]
    t0 = dt.datetime.strptime(base[0]["timestamp"], "%m-%d-%Y %H:%M:%S.%f")
    return [
        {**base[i % len(base)], "iter": i, "timestamp": (t0 + dt.timedelta(milliseconds=50 * i)).strftime(STAMP)}
        for i in range(n)
    ]


STAMP = "%m-%d-%Y %H:%M:%S.%f"


def _load_records(tmp_path, name: str, recs: list[dict]):
    from pipeline import store

    path = tmp_path / f"{name}.txt"
    path.write_text("\n".join(repr(r) for r in recs) + "\n")
    con = store.connect(tmp_path / f"{name}.duckdb")
    (res,) = load(con, path)
    lines = sorted(r[0] for r in con.execute("select line_no from rejects").fetchall())
    con.close()
    return res, lines


@pytest.mark.parametrize("batch_bytes", [None, 1500, 3000])
@pytest.mark.long
def test_two_and_three_records_in_a_row_stamped_ahead_are_the_ones_rejected(tmp_path, monkeypatch, batch_bytes):
    """Two (then three) records in a row an hour ahead, at the start, the middle and near the end: the
    first was in order with the second, the second had no neighbour before it in order, so neither
    was taken for an outlier and every record after them was 'behind'.  Also across batches of
    lines (1500 and 3000 bytes: one or two records a batch)."""
    if batch_bytes:
        from pipeline.ingest import reader

        monkeypatch.setattr(reader, "BATCH_BYTES", batch_bytes)
    for n_ahead in (2, 3):
        for at in (0, 4, 12 - n_ahead - 1):
            bad = _tiled(12)
            for r in bad[at : at + n_ahead]:
                r["timestamp"] = (dt.datetime.strptime(r["timestamp"], STAMP) + dt.timedelta(hours=1)).strftime(STAMP)
            res, lines = _load_records(tmp_path, f"ahead{n_ahead}_{at}", bad)
            assert (res.accepted, res.rejected, res.lines_read) == (12 - n_ahead, n_ahead, 12), (n_ahead, at)
            assert lines == list(range(at + 1, at + 1 + n_ahead)), (n_ahead, at)


@pytest.mark.long
def test_records_after_one_stamped_ahead_are_judged_alike_in_any_batch_size(tmp_path, monkeypatch):
    """A record an hour ahead, then three good records and one 0.2 s behind them. The rule for runs
    ahead takes the record before a run from the file: within a batch of lines that was the record
    ahead (no run starts after it), but across a batch's edge it was the latest good record, so
    with a record a batch the three good records were taken for a run ahead of the one behind and
    rejected in its place. Both ways now see the same records before a run."""
    from pipeline.ingest import reader

    recs = _tiled(12)
    for i, shift in ((3, dt.timedelta(hours=1)), (7, -dt.timedelta(seconds=0.2))):
        recs[i]["timestamp"] = (dt.datetime.strptime(recs[i]["timestamp"], STAMP) + shift).strftime(STAMP)
    whole, lines = _load_records(tmp_path, "whole", recs)
    assert lines == [4, 8] and whole.accepted == 10
    monkeypatch.setattr(reader, "BATCH_BYTES", 1500)  # about one record a batch
    res, lines = _load_records(tmp_path, "one_a_batch", recs)
    assert lines == [4, 8] and res.accepted == 10


@pytest.mark.parametrize("batch_bytes", [None, 1500])
@pytest.mark.parametrize("at, back_s", [(2, 2400.0), (7, 0.2), (8, 0.17)])
@pytest.mark.long
def test_one_record_behind_good_ones_is_the_one_rejected(tmp_path, monkeypatch, batch_bytes, at, back_s):
    """One record slipped behind: 40 min as a file's 3rd record, or 0.2 s behind the three good
    records before it. The good records before it were taken for a run stamped ahead of it (the
    run's record before was earlier than it) and rejected in its place, two or three for one; a run
    is now the outlier only when as many records after it are behind it. (As the 2nd record it
    ties with the first record being ahead, one reject either way: the first is rejected.)"""
    if batch_bytes:
        from pipeline.ingest import reader

        monkeypatch.setattr(reader, "BATCH_BYTES", batch_bytes)
    recs = _tiled(12)
    stamp = dt.datetime.strptime(recs[at]["timestamp"], STAMP) - dt.timedelta(seconds=back_s)
    recs[at]["timestamp"] = stamp.strftime(STAMP)
    res, lines = _load_records(tmp_path, f"behind{at}", recs)
    assert lines == [at + 1] and (res.accepted, res.rejected) == (11, 1)


@pytest.mark.parametrize("batch_bytes", [None, 1500])
@pytest.mark.long
def test_run_limits_come_from_the_log_when_its_first_record_is_rejected(tmp_path, monkeypatch, batch_bytes):
    """The run's limits (max_num_seqs, max_num_batched_tokens, KV tokens; the replay reads them)
    came from the first batch's first good record: with a record a batch and the first record
    rejected, the run had none."""
    from pipeline import store
    from pipeline.ingest import reader

    if batch_bytes:
        monkeypatch.setattr(reader, "BATCH_BYTES", batch_bytes)
    recs = [ast.literal_eval(line) for line in (FIX / "iteration_log.txt").read_text().splitlines()]
    recs[0].pop("iterLatencyMS")
    path = tmp_path / "log.txt"
    path.write_text("\n".join(repr(r) for r in recs) + "\n")
    con = store.connect(tmp_path / "s.duckdb")
    (res,) = load(con, path, tz="UTC")
    meta = json.loads(con.execute("select meta from runs").fetchall()[0][0])
    assert res.rejected == 1
    assert (meta["max_num_seqs"], meta["max_num_batched_tokens"], meta["kv_cache_tokens"]) == (64, 8192, 101256 * 32)


def test_order_checks_do_not_depend_on_batch_size_random(tmp_path, monkeypatch):
    """Random logs (8-30 records, about 19% damaged: stamps an hour, 5 s or a year ahead, 0.2 s,
    5 s or 40 min behind, a field missing) give the same rejects read whole and a record a batch.
    The seeds are among the 11 of the first 60 that differed before; the same check over 300
    other seeds found none that differs now (a one-off run, too slow for the tests)."""
    import random

    from pipeline.ingest import reader

    whole_bytes = reader.BATCH_BYTES
    for seed in (5, 11, 17, 20, 41, 52):
        rng = random.Random(seed)
        recs = _tiled(rng.randint(8, 30))
        for r in recs:
            u = rng.random()
            if u < 0.16:
                s = rng.choice([3600, 5, 366 * 86400] if u < 0.08 else [-0.2, -5, -2400])
                r["timestamp"] = (dt.datetime.strptime(r["timestamp"], STAMP) + dt.timedelta(seconds=s)).strftime(STAMP)
            elif u < 0.19:
                r.pop("iterLatencyMS")
        got = []
        for batch_bytes in (whole_bytes, 1500):
            monkeypatch.setattr(reader, "BATCH_BYTES", batch_bytes)
            got.append(_load_records(tmp_path, f"r{seed}_{batch_bytes}", recs)[1])
        assert got[0] == got[1], seed


@pytest.mark.parametrize("batch_bytes", [None, 1500])
@pytest.mark.parametrize("repeated", [2, 4, 5])
@pytest.mark.long
def test_a_repeated_block_is_rejected_not_the_records_before_it(tmp_path, monkeypatch, batch_bytes, repeated):
    """A log fetched twice in part (copytruncate): the last records written again after themselves,
    with their own stamps.  The first rule for records ahead took the good records before the copy
    for a run ahead of it (the copy starts earlier) and kept the copy instead."""
    if batch_bytes:
        from pipeline.ingest import reader

        monkeypatch.setattr(reader, "BATCH_BYTES", batch_bytes)
    recs = _tiled(20)
    copy = [{**r, "iter": 100 + i} for i, r in enumerate(recs[12 - repeated : 12])]
    res, lines = _load_records(tmp_path, f"rep{repeated}", recs[:12] + copy + recs[12:])
    # the copy's last record ties with the original's (ties are in order): the rest of it is behind
    assert lines == list(range(13, 12 + repeated)) and res.accepted == 20 + 1


@pytest.mark.parametrize(
    "field, sub",
    [("kvCacheStats", "tokensPerBlock"), (None, "scheduledSumPrefillKvTokens"), (None, "queuedNumDecodeRequests")],
)
@pytest.mark.long
def test_a_huge_count_rejects_its_record_not_the_file(con, tmp_path, field, sub):
    """A count near 2^63 in a field that is multiplied or added (KV tokens = blocks x tokens per block,
    context = prefill + decode KV tokens) overflowed DuckDB's BIGINT: the whole file failed with
    'Out of Range Error' and nothing was stored."""
    recs = [ast.literal_eval(line) for line in (FIX / "iteration_log.txt").read_text().splitlines()]
    huge = 2**62 + 1
    if field:
        recs[2] = {**recs[2], field: {**recs[2][field], sub: huge}}
    else:
        recs[2] = {**recs[2], sub: huge, "scheduledSumDecodeKvTokens": huge, "queuedNumPrefillRequests": huge}
    path = tmp_path / "iteration_log.txt"
    path.write_text("\n".join(repr(r) for r in recs) + "\n")
    (res,) = load(con, path)
    assert (res.accepted, res.rejected) == (5, 1)
    ((line_no, reason),) = con.execute("select line_no, reason from rejects").fetchall()
    assert line_no == 3 and f"{sub}: {huge} is implausibly large" in reason, reason
