"""The first big file of `tracelat ingest` hashed while the command starts (filehash.prefetch)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os

import pytest

from pipeline import filehash


@pytest.fixture(autouse=True)
def _no_slot():
    filehash._slot = None
    yield
    filehash._slot = None


def _big(path, n=None):
    line = json.dumps({"kind": "iteration", "iter": 0, "t_start": 1.0, "t_end": 1.01, "x": 'a "quoted" word'}) + "\n"
    n = n or filehash.PREFETCH_MIN_BYTES // len(line) + 10
    lines = [line.replace('"iter": 0', f'"iter": {i}') for i in range(n)]
    path.write_text("".join(lines))
    return path


def test_a_prefetched_hash_is_the_files_and_is_taken_once(tmp_path):
    f = _big(tmp_path / "t.jsonl")
    filehash.prefetch([f, tmp_path / "other.jsonl"])
    fut = filehash.take(f, count_quotes=True)
    assert fut is not None
    body = f.read_bytes()
    assert fut.result() == (hashlib.sha256(body).hexdigest(), body.count(b'"'))
    assert fut.result() == filehash.sha256_and_quotes(f)
    assert filehash.take(f, count_quotes=True) is None  # taken


def test_nothing_is_prefetched_or_taken_when_it_would_be_wrong(tmp_path):
    small = tmp_path / "s.jsonl"
    small.write_text('{"kind": "run"}\n')
    filehash.prefetch([small])
    assert filehash._slot is None
    filehash.prefetch([tmp_path])  # a folder: its files are found later
    assert filehash._slot is None
    # compressed: no quote count (its bytes say nothing of the lines), so none is handed out for one
    gz = tmp_path / "c.jsonl.gz"
    gz.write_bytes(gzip.compress(_big(tmp_path / "raw.jsonl").read_bytes(), compresslevel=0))
    filehash.prefetch([gz])
    assert filehash.take(gz, count_quotes=True) is None
    filehash.prefetch([gz])
    assert filehash.take(gz, count_quotes=False).result()[0] == hashlib.sha256(gz.read_bytes()).hexdigest()
    # another file, or this one changed since: the caller hashes it itself, and the prefetch
    # stops reading (no second thread hashing beside DuckDB's)
    f = _big(tmp_path / "t.jsonl")
    filehash.prefetch([f])
    *_, fut, stop = filehash._slot
    assert filehash.take(tmp_path / "raw.jsonl", count_quotes=True) is None and stop.is_set()
    assert filehash._slot is None and filehash.take(f, count_quotes=True) is None  # asked once
    exc = fut.exception(timeout=30)
    assert exc is None or isinstance(exc, filehash.Cancelled)
    filehash.prefetch([f])
    st = os.stat(f)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert filehash.take(f, count_quotes=True) is None


def test_cli_ingest_stores_the_prefetched_hash(tmp_path, monkeypatch):
    from pipeline import store
    from pipeline.cli import run_captured

    f = _big(tmp_path / "big.jsonl")
    taken = []
    real = filehash.take
    monkeypatch.setattr(filehash, "take", lambda p, q: taken.append(r := real(p, q)) or r)
    code, out = run_captured("ingest", f, "--db", tmp_path / "s.duckdb")
    assert code == 0, out
    assert len(taken) == 1 and taken[0] is not None  # the ingest used the prefetched hash
    con = store.connect(tmp_path / "s.duckdb", read_only=True)
    try:
        sha, accepted = con.execute("select sha256, lines_accepted from ingests").fetchone()
    finally:
        con.close()
    assert sha == hashlib.sha256(f.read_bytes()).hexdigest()
    assert accepted == len(f.read_text().splitlines())
