"""The fast path of canonical JSONL files (DuckDB reads, parses and validates every line in
one scan) follows every rule of the batch path: line numbers, rejects with their raw text,
duplicates across batches, run identity, compressed files; what it cannot read goes the
batch path."""

from __future__ import annotations

import gzip
import json

import pytest

from pipeline import ingest
from pipeline.ingest import canonical, reader


def it(i: int, **kw) -> dict:
    return {"kind": "iteration", "iter": i, "t_start": i * 0.01, "t_end": (i + 1) * 0.01, "decode_tokens": 1} | kw


def req(r: str, t0: float, n: int = 3, **kw) -> dict:
    times = [t0 + 0.01 * (k + 1) for k in range(n)]
    return {
        "kind": "request",
        "req_id": r,
        "t_arrival": t0,
        "t_first_token": times[0],
        "t_finish": times[-1],
        "output_tokens": n,
        "token_times": times,
    } | kw


def text(lines: list) -> str:
    return "".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines)


def state(con) -> dict:
    out = {
        t: sorted(map(str, con.execute(f"select * exclude (ingest_id) from {t}").fetchall()))
        for t in ("iterations", "requests", "tokens", "runs", "run_records", "rejects")
    }
    out["ingests"] = con.execute(
        "select lines_read, lines_accepted, lines_rejected, lines_skipped, run_ids from ingests"
    ).fetchall()
    return out


def spy_stage(monkeypatch, convert, fast: str = "fast", batch: str = "batch") -> list[str]:
    """Which path each ingest through ``convert`` took: its DuckDB stage (``fast``) or not."""
    seen: list[str] = []
    real = convert.stage

    def spy(con, path, default_run):
        staged = real(con, path, default_run)
        seen.append(fast if staged is not None else batch)
        return staged

    monkeypatch.setattr(convert, "stage", spy)
    return seen


@pytest.fixture
def used(monkeypatch):
    """Which path each ingest took."""
    return spy_stage(monkeypatch, canonical.convert_jsonl)


def both_paths(tmp_path, monkeypatch, name: str, content: bytes, **kw) -> tuple[dict, dict]:
    """The store after ingesting ``content`` by the fast path and by the batch path."""
    f = tmp_path / name
    f.write_bytes(content)
    return stores_of_both_paths(tmp_path, monkeypatch, f, canonical.convert_jsonl, **kw)


def stores_of_both_paths(tmp_path, monkeypatch, f, convert, **kw) -> tuple[dict, dict]:
    """The store after ingesting file ``f`` with ``convert``'s DuckDB stage, and without it."""
    from pipeline import store

    out = []
    for fast in (True, False):
        con = store.connect(tmp_path / f"{'fast' if fast else 'batch'}.duckdb")
        if not fast:
            monkeypatch.setattr(convert, "stage", None)
        ingest.ingest_paths(con, [f], **kw)
        out.append(state(con))
        con.close()
    return out[0], out[1]


MIXED = [
    {"kind": "run", "run_id": "A", "engine": "e", "meta": {"max_num_seqs": 8}},
    it(0),
    it(1, gpu_temp_c=70),
    "",
    "garbage",
    "[1,2]",
    it(1),  # duplicate of line 3
    {"kind": "nope"},
    {"x": 1},
    {"kind": 5},
    it(2, t_start="abc"),
    it(3, iter=3.5),
    it(4, decode_tokens=-1, kv_usage=2.0),
    it(5, decode_tokens=True),
    it(6, decode_tokens="7"),
    it(7, t_start=None),
    it(8, dur_ms=float("nan")),
    req("a", 0.0),
    req("b", 0.5, token_times=[0.6, 0.55, 0.7]),
    req("a", 1.0),  # duplicate req a
    req("c", 0.0, token_times="soon"),
    req("d", 0.0, req_note={"k": "v"}),
    req("e", 0.0, status="odd"),
    req("f", 0.0, run_id="B"),
    {"kind": "run", "run_id": "C"},
    it(0),
    req(7, 0.0),
    req("g", 0.0, req_id=1.5),
    {"kind": "run"},
    it(9),
    {"kind": "run", "run_id": {"x": 1}},
    it(10, req_ids=["a", 1]),
    it(11, req_ids="a"),
    '{"kind":"iteration","iter":12,"dur_ms":1,"note":"say \\"hi\\""}',
    '  {"kind":"iteration", "iter":13, "dur_ms":1}  ',
    '{"kind":"iteration","iter":14,"dur_ms":1,"x":{"y":"z"}}',
    '{"kind":"iteration","iter":15,"dur_ms":1,"iter":16}',
    '{"kind":"request","req_id":"h","t_arrival":0,"token_times":[0.1,NaN]}',
    '{"kind":"request","req_id":"i","t_arrival":0,"token_times":[0.1,"x"]}',
    json.dumps(it(17))[:30],  # truncated last line
]


@pytest.mark.parametrize("optimised", [False, True])
def test_same_store_as_the_batch_path(tmp_path, monkeypatch, used, optimised):
    """Staged with DuckDB's optimiser off (a small file) and on (a big one: the limit set to 0)."""
    if optimised:
        monkeypatch.setattr(canonical, "UNOPTIMISED_MAX_BYTES", 0)
    fast, batch = both_paths(tmp_path, monkeypatch, "mixed.jsonl", text(MIXED).encode())
    assert used == ["fast"]  # then the batch path, which has no stage step
    assert fast == batch
    assert fast["ingests"][0][:4] == (len(MIXED), len(MIXED) - 1 - len(fast["rejects"]), len(fast["rejects"]), 1)


def test_same_store_in_many_small_batches(tmp_path, monkeypatch, used):
    monkeypatch.setattr(reader, "BATCH_BYTES", 200)
    monkeypatch.setattr(canonical, "STAGED_SLICE_BATCHES", 1)  # the staged rows in many slices too
    fast, batch = both_paths(tmp_path, monkeypatch, "mixed.jsonl", text(MIXED).encode(), run_id="cli")
    assert used == ["fast"]  # then the batch path, which has no stage step
    assert fast == batch


def test_reject_lines_in_a_gzip_file_and_on_the_last_line(con, tmp_path, used):
    lines = [it(i) for i in range(5000)]
    lines[1233] = "garbage"
    lines[4321] = it(4321, t_end=-1.0)
    f = tmp_path / "g.jsonl.gz"
    f.write_bytes(gzip.compress((text(lines) + json.dumps(it(5000))[:20]).encode()))  # no newline at the end
    (res,) = ingest.ingest_paths(con, [f])
    assert used == ["fast"]
    assert (res.lines_read, res.accepted, res.rejected) == (5001, 4998, 3)
    got = dict(con.execute("select line_no, raw from rejects").fetchall())
    assert sorted(got) == [1234, 4322, 5001]
    assert got[1234] == "garbage" and got[5001] == json.dumps(it(5000))[:20]
    assert json.loads(got[4322])["iter"] == 4321


def test_reject_on_the_last_line_with_a_newline(con, tmp_path, used):
    f = tmp_path / "last.jsonl"
    f.write_text(text([it(0), it(1), it(0)]))
    ingest.ingest_paths(con, [f])
    assert con.execute("select line_no, reason, raw from rejects").fetchall() == [
        (3, "duplicate iter 0 in run last (first at line 1)", json.dumps(it(0)))
    ]


@pytest.mark.long
def test_line_numbers_follow_the_file_in_a_parallel_scan(con, tmp_path, monkeypatch, used):
    """Read in 1 MiB buffers by several threads (DuckDB's default is 32 MiB): lines keep their numbers."""
    assert canonical._READ.endswith(")")
    monkeypatch.setattr(canonical, "_READ", canonical._READ[:-1] + ", buffer_size=1048576)")
    monkeypatch.setattr(canonical, "MAX_LINE_BYTES", 1 << 19)  # a buffer must hold the longest line
    con.execute("set threads = 4")
    n = 300_000
    bad = {7, 65_537, 150_001, 299_999, n}
    f = tmp_path / "big.jsonl"
    with open(f, "w") as out:
        for i in range(1, n + 1):
            out.write(("{bad" if i in bad else json.dumps({"kind": "iteration", "iter": i, "dur_ms": 1.0})) + "\n")
    (res,) = ingest.ingest_paths(con, [f])
    assert used == ["fast"] and res.rejected == len(bad)
    assert {r[0] for r in con.execute("select line_no from rejects").fetchall()} == bad
    # every stored step is on the line that holds it
    assert con.execute("select count(*) from iterations where line_no <> iter").fetchall() == [(0,)]


def test_duplicates_across_batches_name_the_first_line_and_keep_raw(con, tmp_path, monkeypatch, used):
    monkeypatch.setattr(reader, "BATCH_BYTES", 4096)
    lines = [it(i) for i in range(2000)] + [it(10, t_end=99.0), req("a", 0.0), req("a", 1.0)]
    f = tmp_path / "d.jsonl"
    f.write_text(text(lines))
    (res,) = ingest.ingest_paths(con, [f])
    assert used == ["fast"]
    assert (res.accepted, res.rejected) == (2001, 2)
    rows = con.execute("select line_no, reason, raw from rejects order by line_no").fetchall()
    assert rows == [
        (2001, "duplicate iter 10 in run d (first at line 11)", json.dumps(it(10, t_end=99.0))),
        (2003, "duplicate req_id a in run d (first at line 2002)", json.dumps(req("a", 1.0))),
    ]


def test_file_larger_than_a_batch_with_runs_in_the_middle(con, tmp_path, monkeypatch, used):
    monkeypatch.setattr(reader, "BATCH_BYTES", 1000)
    lines = [it(i) for i in range(50)] + [{"kind": "run", "run_id": "Z"}] + [it(i) for i in range(50)]
    f = tmp_path / "night.trace.jsonl"
    f.write_text(text(lines))
    (res,) = ingest.ingest_paths(con, [f])
    assert used == ["fast"] and res.accepted == 101
    assert dict(con.execute("select run_id, count(*) from iterations group by 1").fetchall()) == {"night": 50, "Z": 50}


@pytest.mark.parametrize("what", ["crlf", "latin1", "long_line", "zstd_frames"])
@pytest.mark.long
def test_what_duckdb_cannot_read_as_is_goes_the_batch_path(con, tmp_path, monkeypatch, used, what):
    body = text([it(0), it(1), "oops", it(2)])
    f = tmp_path / "x.jsonl"
    if what == "long_line":
        monkeypatch.setattr(canonical, "MAX_LINE_BYTES", 1024)
        f.write_text(body + json.dumps(it(3, note="x" * 2000)) + "\n")
    elif what == "crlf":
        f.write_bytes(body.replace("\n", "\r\n").encode())
    elif what == "latin1":
        f.write_bytes(body.encode() + b'{"kind":"iteration","iter":3,"dur_ms":1,"note":"caf\xe9"}\n')
    else:
        import zstandard

        c = zstandard.ZstdCompressor()
        raw = body.encode()
        f.write_bytes(c.compress(raw[:50]) + c.compress(raw[50:]))  # two frames
    (res,) = ingest.ingest_paths(con, [f])
    assert used == (["fast"] if what == "zstd_frames" else ["batch"])
    assert con.execute("select line_no from rejects").fetchall() == [(3,)]
    assert res.accepted == (4 if what in ("latin1", "long_line") else 3)


def test_without_insertion_order_the_batch_path_numbers_lines(con, tmp_path, used):
    con.execute("set preserve_insertion_order = false")
    f = tmp_path / "o.jsonl"
    f.write_text(text([it(0), "oops", it(1)]))
    (res,) = ingest.ingest_paths(con, [f])
    assert used == ["batch"] and res.accepted == 2
    assert con.execute("select line_no from rejects").fetchall() == [(2,)]


@pytest.mark.parametrize("n_runs", [3, 70])  # a CASE over the run lines; over 64, a window
@pytest.mark.long
def test_each_line_in_the_run_of_the_last_run_record_before_it(tmp_path, monkeypatch, used, n_runs):
    from pipeline import store

    lines = [it(100)]  # before any run record: the file's run
    for k in range(n_runs):
        lines += [{"kind": "run", "run_id": f"r{k}"}, it(k), req(f"q{k}", 0.0)]
    lines += [it(200, run_id="own")]
    fast, batch = both_paths(tmp_path, monkeypatch, "runs.jsonl", text(lines).encode())
    assert used == ["fast"] and fast == batch
    con = store.connect(tmp_path / "batch.duckdb")
    got = con.execute("select iter, run_id from iterations order by iter").fetchall()
    assert got == [(k, f"r{k}") for k in range(n_runs)] + [(100, "runs"), (200, "own")]
    reqs = con.execute("select req_id, run_id from requests").fetchall()
    assert sorted(reqs) == sorted((f"q{k}", f"r{k}") for k in range(n_runs))
