"""Every connection of ours runs ASOF joins as ASOF joins, never as a nested loop.

DuckDB plans an ASOF join as a nested loop when it estimates at most
``asof_loop_join_threshold`` rows on the left, and its estimate for unnested lists is
small whatever they hold: token times joined to steps (fit attribution) went quadratic.
"""

from __future__ import annotations

import re
import time

import pytest

from pipeline import store

LOOP = re.compile(r"(?i)nested[ _]loop[ _]join")
ASOF = re.compile(r"(?i)asof[ _]join")

# 20 requests of 2000 token times each, against 10k steps: the shape of request_attribution's
# token_steps (few requests, long lists) that DuckDB estimates at a handful of rows
SETUP = (
    "create or replace temp table lists as select i::varchar as req_id, "
    "list_transform(range(2000), lambda j: (i * 2000 + j) * 0.001) as t_s from range(20) t(i)",
    "create or replace temp table steps as select i * 0.004 as t_end, i as k from range(10000) t(i)",
)
QUERY = (
    "select count(*), sum(x.k) from (select req_id, unnest(t_s) as t from lists) as t "
    "asof left join steps as x on t.t + 1e-6 >= x.t_end"
)


@pytest.fixture(params=["store", "store_read_only", "scratch"])
def connection(request, tmp_path):
    if request.param == "scratch":
        con = store.scratch()
    else:
        store.connect(tmp_path / "s.duckdb").close()
        con = store.connect(tmp_path / "s.duckdb", read_only=request.param == "store_read_only")
    yield con
    con.close()


def test_asof_join_of_unnested_lists_is_planned_as_asof(connection):
    for sql in SETUP:
        connection.execute(sql)
    plan = connection.execute("explain " + QUERY).fetchall()[0][1]
    assert ASOF.search(plan) and not LOOP.search(plan), plan


def test_asof_join_of_unnested_lists_matches_every_time_to_its_step(connection):
    for sql in SETUP:
        connection.execute(sql)
    t = time.perf_counter()
    n, sum_k = connection.execute(QUERY).fetchall()[0]
    # independent: time (i*2000 + j) ms matches step floor(t / 4 ms) (times 1e-6 early still match)
    assert n == 40000
    assert sum_k == sum(min((m + 0.001) // 4, 9999) for m in range(40000))
    assert time.perf_counter() - t < 2.0  # as a nested loop: 5 s here
