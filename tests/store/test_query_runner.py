"""The store's query runner and the on-demand query files of queries/<area>/.

Every file declares table, grain, inputs, params and purpose; the params it declares are
the ones its SQL binds, and its inputs are the tables it reads. The runner binds only
what a query uses, refuses a query whose parameter is missing, and ``materialise``
replaces one run's rows and nothing else.
"""

from __future__ import annotations

import re

import duckdb
import pytest

from pipeline import store
from pipeline.resources import QUERIES_DIR

from .test_queries import referenced_tables

ON_DEMAND = sorted(p for p in QUERIES_DIR.glob("*/*.sql") if p.parent.name != "checks")


def header(text: str) -> dict[str, str]:
    """The header's keys; an indented comment line continues the key above it."""
    head: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        m = re.match(r"--\s*(\w+):\s*(.*)", line)
        if m:
            key = m.group(1)
            head[key] = m.group(2).strip()
        elif key is not None:
            head[key] += " " + line[2:].strip()
    return head


def body(text: str) -> str:
    return re.sub(r"--[^\n]*", "", text)


def test_the_moved_queries_are_there():
    names = {f"{p.parent.name}/{p.stem}" for p in ON_DEMAND}
    assert {
        "audit/fluidity",
        "ingest/context_estimate",
        "ingest/context_candidates",
        "fit/tail_coverage",
        "fit/tail_top_requests",
        "fit/stall_stats",
        "engine_metrics/counter_increase",
    } <= names


@pytest.mark.parametrize("path", ON_DEMAND, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_header_declares_table_grain_inputs_params_purpose(path):
    text = path.read_text()
    head = header(text)
    assert {"table", "grain", "inputs", "params", "purpose"} <= head.keys(), head
    declared = set(re.findall(r"\$(\w+)", head["params"]))
    assert declared == set(re.findall(r"\$([A-Za-z_]\w*)", body(text))), "params line differs from the SQL"
    inputs = {s.strip() for s in head["inputs"].split(",")}
    assert inputs == referenced_tables(text), "inputs line differs from the tables the SQL reads"
    assert head["table"].split()[0] in (path.stem, "ctx_est", "_gaps")


def test_bind_keeps_what_the_sql_uses_and_refuses_a_missing_one():
    sql = "select $a + $b -- not $c\n"
    assert store.bind(sql, {"a": 1, "b": 2, "z": 3}) == {"a": 1, "b": 2}
    with pytest.raises(store.StoreError, match=r"needs parameters \['b'\]"):
        store.bind(sql, {"a": 1})


def test_a_missing_query_file_is_a_store_error():
    with pytest.raises(store.StoreError, match="is missing"):
        store.query_text("fit/no_such_query")


def test_materialise_replaces_one_runs_rows_and_follows_column_changes(tmp_path, monkeypatch):
    (tmp_path / "t").mkdir()
    q = tmp_path / "t" / "sq.sql"
    monkeypatch.setattr(store, "QUERIES_DIR", tmp_path)
    con = duckdb.connect()
    con.execute("create table src as select * from (values ('a', 1), ('a', 2), ('b', 5)) v(run_id, x)")
    q.write_text("select run_id, x * $k as y from src where run_id = $run_id")
    store.materialise(con, "t/sq", {"run_id": "a", "k": 10})
    store.materialise(con, "t/sq", {"run_id": "b", "k": 10})
    store.materialise(con, "t/sq", {"run_id": "a", "k": 100, "unused": 1})  # a's rows replaced, b's kept
    assert sorted(con.execute("select * from sq").fetchall()) == [("a", 100), ("a", 200), ("b", 50)]
    q2 = tmp_path / "t" / "sq2.sql"  # other columns than the stored table: rebuilt
    q2.write_text("select run_id, x as y, -x as z from src where run_id = $run_id")
    store.materialise(con, "t/sq2", {"run_id": "b"}, table="sq")
    assert con.execute("select * from sq").fetchall() == [("b", 5, -5)]
    store.materialise(con, "t/sq", {"run_id": "a", "k": 1}, table="tmp_sq", temp=True)
    assert con.execute("select y from temp.main.tmp_sq order by y").fetchall() == [(1,), (2,)]
    assert store.select(con, "t/sq", {"run_id": "b", "k": 2})["y"].to_list() == [10]
    assert store.rows(con, "t/sq", {"run_id": "b", "k": 3}) == [("b", 15)]
