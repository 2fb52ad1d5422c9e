"""DuckDB's parallel reader as a line reader (reader.duckdb_line_batches): the same numbered
lines as the Python reader, or a clear refusal the caller falls back from."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from pipeline.ingest import reader

from .conftest import load

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"


def _lines(tables) -> list[tuple[int, str]]:
    out = []
    for t in tables:
        d = t.to_pydict()
        out += [(n, r or "") for n, r in zip(d["line_no"], d["raw"])]  # a blank line: NULL here, '' there
    return out


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("text", ["a\n\nb c\n", "first\n  \n\nlast without newline", "", "\n\n", "x" * 5000 + "\ny\n"])
def test_same_numbered_lines_as_the_python_reader(tmp_path, monkeypatch, text, gz):
    monkeypatch.setattr(reader, "BATCH_BYTES", 8)  # several batches: numbering must carry over
    p = tmp_path / ("t.log.gz" if gz else "t.log")
    p.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    fast = reader.duckdb_line_batches(p)
    assert fast is not None
    assert _lines(fast) == _lines(reader.line_batches(p))


def test_refuses_crlf_and_damaged_gzip(tmp_path):
    crlf = tmp_path / "crlf.log"
    crlf.write_bytes(b"a\r\nb\r\n")
    assert reader.duckdb_line_batches(crlf) is None
    broken = tmp_path / "broken.log.gz"
    body = b"".join(b"line %d\n" % i for i in range(50_000))  # the head reads; the end is cut off
    broken.write_bytes(gzip.compress(body)[:-12])
    assert reader.duckdb_line_batches(broken) is None


def test_a_line_it_cannot_read_fails_the_scan(tmp_path):
    p = tmp_path / "bad.log"
    p.write_bytes(b"ok\n" * 10 + b"\xff\xfe not utf-8\n" + b"ok\n")
    with pytest.raises(reader.FastReadFailed):
        list(reader.duckdb_line_batches(p))


@pytest.mark.long
def test_vllm_log_with_a_bad_byte_part_way_falls_back_to_the_line_reader(tmp_path, monkeypatch, con):
    """Invalid UTF-8 after the first batch: DuckDB fails part-way, the converter starts over with
    the Python reader, and every step and line number is as in the clean log."""
    from pipeline import store

    monkeypatch.setattr(reader, "BATCH_BYTES", 4096)
    lines = (FIX / "server_epoch.log").read_bytes().split(b"\n")
    k = len(lines) // 2
    lines.insert(k, b"noise \xff\xfe")  # not a step line: skipped either way
    bad = tmp_path / "server_epoch.log"
    bad.write_bytes(b"\n".join(lines))
    used = []
    fast, slow = reader.duckdb_line_batches, reader.line_batches
    monkeypatch.setattr(reader, "duckdb_line_batches", lambda *a: used.append("duckdb") or fast(*a))
    monkeypatch.setattr(reader, "line_batches", lambda *a, **k: used.append("python") or slow(*a, **k))
    (res,) = load(con, bad)
    assert used == ["duckdb", "python"] and res.rejected == 0
    clean = tmp_path / "clean" / "server_epoch.log"
    clean.parent.mkdir()
    lines[k] = b"noise"
    clean.write_bytes(b"\n".join(lines))
    other = store.connect(tmp_path / "clean.duckdb")
    (want,) = load(other, clean)
    assert (res.accepted, res.skipped, res.lines_read) == (want.accepted, want.skipped, want.lines_read)
    q = "select iter, t_start, t_end, dur_ms, decode_tokens from iterations order by iter"
    assert con.execute(q).fetchall() == other.execute(q).fetchall()


def test_vllm_log_is_read_by_duckdb(tmp_path, monkeypatch, con):
    """The plain log goes DuckDB's way (the Python reader is never called) with the same result."""
    from pipeline import store

    (want,) = load(store.connect(tmp_path / "a.duckdb"), FIX / "server.log")

    def no(*a, **k):
        raise AssertionError("the Python line reader was used")

    monkeypatch.setattr(reader, "line_batches", no)
    (res,) = load(con, FIX / "server.log")
    assert (res.accepted, res.rejected, res.skipped, res.lines_read) == (
        want.accepted,
        want.rejected,
        want.skipped,
        want.lines_read,
    )


@pytest.mark.parametrize(
    "rel", ["vllm/server.log", "vllm/server_epoch.log", "sglang/server.log", "sglang/server_2026.log"]
)
@pytest.mark.long
def test_whole_file_converters_store_the_same_with_either_reader(tmp_path, monkeypatch, rel):
    """Every stored column of the steps and rejects, DuckDB's reader against the Python one."""
    from pipeline import store

    path = FIX.parent / rel
    fast = store.connect(tmp_path / "fast.duckdb")
    (a,) = load(fast, path)
    monkeypatch.setattr(reader, "duckdb_line_batches", lambda *a: None)
    slow = store.connect(tmp_path / "slow.duckdb")
    (b,) = load(slow, path)
    assert (a.accepted, a.rejected, a.skipped, a.lines_read) == (b.accepted, b.rejected, b.skipped, b.lines_read)
    assert a.accepted > 0
    for q in (
        "select * exclude (ingest_id) from iterations order by run_id, iter",
        "select line_no, reason, raw from rejects order by line_no",
        "select * exclude (ingest_id) from runs order by run_id",
    ):
        assert fast.execute(q).fetchall() == slow.execute(q).fetchall(), q


def test_both_readers_drop_a_byte_order_mark(tmp_path):
    """A leading BOM is no part of the first line, for DuckDB's reader and the Python one alike."""
    p = tmp_path / "bom.log"
    p.write_bytes(b"\xef\xbb\xbfa\nb\n")
    fast = reader.duckdb_line_batches(p)
    assert fast is not None
    assert _lines(fast) == _lines(reader.line_batches(p)) == [(1, "a"), (2, "b")]


@pytest.mark.long
def test_streaming_converter_is_ingested_again_when_duckdb_fails_part_way(tmp_path, monkeypatch, con):
    """vLLM request records (a converter that yields batch by batch): DuckDB fails on a bad byte
    after batches were loaded; the loader rolls the file back and reads it with the Python
    reader: one ingest, every request as in the clean file, nothing twice."""
    from pipeline import store

    monkeypatch.setattr(reader, "BATCH_BYTES", 2048)
    lines = (FIX / "requests.jsonl").read_bytes().rstrip(b"\n").split(b"\n")
    k = len(lines) // 2
    bad = tmp_path / "requests.jsonl"
    bad.write_bytes(b"\n".join(lines[:k] + [b"\xff\xfe"] + lines[k:]) + b"\n")
    used = []
    fast, slow = reader.duckdb_line_batches, reader.line_batches
    monkeypatch.setattr(reader, "duckdb_line_batches", lambda *a: used.append("duckdb") or fast(*a))
    monkeypatch.setattr(reader, "line_batches", lambda *a, **k: used.append("python") or slow(*a, **k))
    (res,) = load(con, bad, fmt="vllm-requests")
    assert used == ["duckdb", "python"]
    assert (res.accepted, res.rejected, res.lines_read) == (len(lines), 1, len(lines) + 1)
    ((line_no,),) = con.execute("select line_no from rejects").fetchall()
    assert line_no == k + 1
    assert con.execute("select count(*) from ingests").fetchall() == [(1,)]
    clean = tmp_path / "clean" / "requests.jsonl"
    clean.parent.mkdir()
    clean.write_bytes(b"\n".join(lines) + b"\n")
    other = store.connect(tmp_path / "clean.duckdb")
    load(other, clean, fmt="vllm-requests")
    q = "select * exclude (ingest_id, line_no) from requests order by req_id"
    assert con.execute(q).fetchall() == other.execute(q).fetchall()
    # line numbers of the file read: one more after the inserted line
    q = "select req_id, line_no from requests order by req_id"
    assert con.execute(q).fetchall() == [(r, n + (n > k)) for r, n in other.execute(q).fetchall()]
    q = "select * exclude (ingest_id) from token_lists order by req_id"
    assert con.execute(q).fetchall() == other.execute(q).fetchall()


def test_progress_of_a_file_read_twice_ends_at_its_size(tmp_path, monkeypatch, con):
    """The progress bar of a file DuckDB fails on part-way: the Python reader's second reading
    shows only what goes past the first, so the bar ends at the file's size, never beyond."""
    import contextlib

    monkeypatch.setattr(reader, "BATCH_BYTES", 2048)
    lines = (FIX / "requests.jsonl").read_bytes()
    f = tmp_path / "requests.jsonl"
    f.write_bytes(lines)
    first: list[int] = []

    def fails_part_way(path, progress=None):  # DuckDB's reader: two batches shown, then a bad line
        def gen():
            for k, table in enumerate(reader.line_batches(path)):
                if k == 2:
                    raise reader.FastReadFailed("a line DuckDB cannot read")
                yield table
                n = sum(len(r.encode()) + 1 for r in table.column("raw").to_pylist())
                first.append(n)
                if progress:
                    progress(n)

        return gen()

    monkeypatch.setattr(reader, "duckdb_line_batches", fails_part_way)
    shown: list[int] = []

    @contextlib.contextmanager
    def progress_for(path):
        yield shown.append

    (res,) = load(con, f, fmt="vllm-requests", progress_for=progress_for)
    assert res.accepted == len(lines.splitlines()) and res.rejected == 0
    assert len(first) == 2 and shown[:2] == first  # the first reading was shown as it went
    assert all(n > 0 for n in shown) and sum(shown) == f.stat().st_size
