"""Every queries/*.sql file declares its table, grain and inputs, and the inputs are true."""

from __future__ import annotations

import re

import pytest

from pipeline import store

FILES = store.query_files()


def referenced_tables(sql: str) -> set[str]:
    body = re.sub(r"--[^\n]*", "", sql)
    ctes = set(re.findall(r"(\w+)\s+as\s*(?:(?:not\s+)?materialized\s*)?\(", body, flags=re.IGNORECASE))
    names = set(re.findall(r"\b(?:from|join)\s+([a-z_][a-z0-9_]*)", body, flags=re.IGNORECASE))
    return {n for n in names if n.lower() not in ctes and n.lower() not in {"select", "lateral", "unnest"}}


@pytest.mark.parametrize("q", FILES, ids=lambda q: q.table)
def test_header_inputs_match_sql(q):
    assert q.table == q.path.stem
    assert q.grain
    assert referenced_tables(q.sql) == set(q.inputs)


def test_inputs_exist_and_order_respects_them(con):
    known = set(store.BASE_TABLES)
    for q in FILES:  # dependency order: each input is a base table or built earlier
        assert set(q.inputs) <= known, (q.table, set(q.inputs) - known)
        known.add(q.table)


def test_cycle_is_reported(tmp_path):
    (tmp_path / "a.sql").write_text("-- table: a\n-- grain: x\n-- inputs: b\nselect * from b\n")
    (tmp_path / "b.sql").write_text("-- table: b\n-- grain: x\n-- inputs: a\nselect * from a\n")
    with pytest.raises(store.StoreError, match="cycle in queries/: a -> b -> a"):
        store.query_files(tmp_path)


def test_derived_tables_rebuilt_only_when_store_changed(con, tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text('{"kind":"iteration","iter":0,"dur_ms":5}\n')
    from pipeline import ingest

    ingest.ingest_paths(con, [f])
    assert store.build_derived(con) is True
    assert store.build_derived(con) is False
    f.write_text('{"kind":"iteration","iter":0,"dur_ms":7}\n')
    ingest.ingest_paths(con, [f], replace=True)
    assert store.build_derived(con) is True
    assert con.execute("select iteration_ms from iteration_metrics").fetchall() == [(7.0,)]


@pytest.mark.long
def test_replace_that_removes_several_ingests_still_rebuilds(con, tmp_path):
    """A count of ingests repeats after a --replace; the store's change counter does not."""
    from pipeline import ingest

    p, q = tmp_path / "p.jsonl", tmp_path / "q.jsonl"
    p.write_text('{"kind":"request","req_id":"a","t_arrival":0,"t_first_token":0.1,"t_finish":0.2}\n')
    q.write_text('{"kind":"iteration","iter":0,"dur_ms":5}\n')
    ingest.ingest_paths(con, [p], run_id="A")
    ingest.ingest_paths(con, [p], run_id="B")
    ingest.ingest_paths(con, [q], run_id="Q")
    store.build_derived(con)
    ingest.ingest_paths(con, [p], run_id="C", replace=True)  # removes A and B (same path), adds C
    assert store.build_derived(con) is True
    runs = {r[0] for r in con.execute("select distinct run_id from request_latency").fetchall()}
    assert runs == {"C"}
