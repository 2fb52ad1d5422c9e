"""Small batches run their statements executed, big ones as relations (store.EXECUTE_ROWS_MAX):
the two ways store the same rows, rejects and counts, for the canonical batch path and for
engine converters."""

from __future__ import annotations

import contextlib
import gzip
from pathlib import Path

import pytest

from pipeline import store

from .conftest import load

FIX = Path(__file__).resolve().parents[2] / "fixtures"

TABLES = {
    "iterations": "select * exclude (ingest_id) from iterations order by all",
    "requests": "select * exclude (ingest_id) from requests order by all",
    "token_lists": "select run_id, req_id, t_s from token_lists order by all",
    "rejects": "select line_no, reason, raw from rejects order by all",
    "metric_samples": "select * exclude (ingest_id) from metric_samples order by all",
}


def _damaged_canonical(tmp_path: Path) -> Path:
    """The tiny canonical trace gzipped (the batch path, not the file-wide staging), with a cut
    line, a bad value and a duplicate of an iteration among its lines."""
    lines = (FIX / "canonical" / "tiny.jsonl").read_text().splitlines()
    lines += ['{"kind": "iteration", "iter": 999, "t_st', '{"kind": "iteration", "iter": 5, "t_start": "x"}']
    lines += [next(x for x in lines if '"iteration"' in x)]
    path = tmp_path / "damaged.jsonl.gz"
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return path


@pytest.mark.parametrize(
    "source",
    ["canonical", "vllm/requests.jsonl", "trtllm/metrics.json", "aiperf/profile_export.jsonl", "sglang/server.log"],
)
@pytest.mark.long
def test_executed_and_relation_statements_store_the_same(tmp_path, monkeypatch, source):
    path = _damaged_canonical(tmp_path) if source == "canonical" else FIX / source
    stored = {}
    counts = {}
    for way, limit in (("executed", 10**9), ("relation", -1)):
        monkeypatch.setattr(store, "EXECUTE_ROWS_MAX", limit)
        con = store.connect(tmp_path / f"{way}.duckdb")
        (res,) = load(con, path, run_id="r", tz="UTC")
        counts[way] = (res.lines_read, res.accepted, res.rejected, res.skipped)
        stored[way] = {t: con.execute(q).fetchall() for t, q in TABLES.items()}
        # the executed way stages without DuckDB's optimiser: it is on again afterwards
        assert store.optimiser_on(con) in (True, None)  # None: DuckDB 1.5 does not show it
        con.close()
    assert counts["executed"] == counts["relation"]
    assert stored["executed"] == stored["relation"]
    assert counts["executed"][1] > 0
    if source == "canonical":
        assert counts["executed"][2] == 3 and len(stored["executed"]["rejects"]) == 3


@pytest.mark.long
def test_the_way_follows_the_rows_a_batch_holds_not_the_lines_it_covers(tmp_path, monkeypatch):
    """A vLLM log's steps come in slices of OUT_BATCH_ROWS typed records: the first covers every
    line of the file, the later ones none (lines_read 0). Each slice's way is chosen by its rows."""
    from pipeline.ingest import load as load_mod
    from pipeline.ingest.engines import vllm_log

    monkeypatch.setattr(vllm_log, "OUT_BATCH_ROWS", 40)
    monkeypatch.setattr(store, "EXECUTE_ROWS_MAX", 30)
    seen: list[tuple[int, int, bool]] = []
    real_load_batch = load_mod.load_batch

    def spy(con, batch, st):
        typed = len(batch.typed.table) if batch.typed is not None else 0
        real_init = load_mod._Scope.__init__

        def init(self, *a, **k):
            real_init(self, *a, **k)
            seen.append((batch.lines_read, typed, self.relation))

        monkeypatch.setattr(load_mod._Scope, "__init__", init)
        try:
            return real_load_batch(con, batch, st)
        finally:
            monkeypatch.setattr(load_mod._Scope, "__init__", real_init)

    monkeypatch.setattr(load_mod, "load_batch", spy)
    con = store.connect(tmp_path / "s.duckdb")
    (res,) = load(con, FIX / "vllm" / "server.log", run_id="r")
    con.close()
    assert res.accepted > 80
    typed = [s for s in seen if s[1]]
    assert len(typed) >= 3
    assert any(lines_read == 0 for lines_read, _, _ in typed)  # the later slices: no lines of their own
    for _, rows, relation in typed:
        assert relation == (rows > 30), seen


@pytest.mark.parametrize(
    "source",
    [
        "vllm/server.log",
        "vllm/requests.jsonl",
        "trtllm/metrics.json",
        "sglang/server.log",
        "aiperf/profile_export.jsonl",
    ],
)
def test_a_converters_table_in_record_batches_stores_the_same(tmp_path, monkeypatch, source):
    """The lines a converter reads, the frames it hands DuckDB and its typed records come in record
    batches (reader.in_batches), which DuckDB reads on several threads: in batches of 2 rows or in
    one, the store is the same."""
    from pipeline.ingest import reader
    from pipeline.ingest.engines import _common

    monkeypatch.setattr(store, "EXECUTE_ROWS_MAX", -1)  # the relation way, as a big file takes
    stored, chunks = {}, {}  # chunks: the rows of each typed table, by batch size
    real = _common.encode

    def spy(*args, **kwargs):
        typed = real(*args, **kwargs)
        chunks.setdefault(size, []).append(typed.table.num_rows)
        assert all(b.num_rows <= size for b in typed.table.to_batches())  # cut where it had more
        return typed

    monkeypatch.setattr(_common, "encode", spy)
    for size in (2, 10**9):
        monkeypatch.setattr(reader, "ARROW_BATCH_ROWS", size)
        con = store.connect(tmp_path / f"{size}.duckdb")
        load(con, FIX / source, run_id="r", tz="UTC")
        stored[size] = {t: con.execute(q).fetchall() for t, q in TABLES.items()}
        con.close()
    assert stored[2] == stored[10**9]
    assert sum(len(rows) for rows in stored[2].values()) > 0
    # the spy saw the converter's tables, and one had more rows than a batch of 2
    assert max(chunks[2]) > 2


@pytest.mark.parametrize("python", [False, True])
def test_line_tables_come_in_record_batches_numbered_on(tmp_path, monkeypatch, python):
    from pipeline.ingest import reader

    monkeypatch.setattr(reader, "ARROW_BATCH_ROWS", 3)
    path = tmp_path / "lines.txt"
    path.write_text("".join(f"line {i}\n" for i in range(1, 12)) + "\nlast\n")
    with reader.python_lines() if python else contextlib.nullcontext():
        tables = list(reader.lines(path))
    assert all(b.num_rows <= 3 for t in tables for b in t.to_batches())
    rows = [r for t in tables for r in t.to_pylist()]
    assert rows == [{"line_no": i, "raw": f"line {i}"} for i in range(1, 12)] + [
        {"line_no": 12, "raw": ""},
        {"line_no": 13, "raw": "last"},
    ]
