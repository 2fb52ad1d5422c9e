"""store.arrow and store.frame: an executed statement's rows (the path of small inputs) come
back as a relation's would, and reading them leaves other threads' warning filters alone."""

from __future__ import annotations

import threading
import warnings

import pytest

from pipeline import store

QUERIES = [
    "select 1 as a, 2 as a, 3 as a",
    "select 1 as a, 2 as a, 3 as a_1",
    "select 1 as a_1, 2 as a, 3 as a",
    "select 1 as A, 2 as a, 3 as x",
    "select 1 as a, 2 as a, 3 as a_1, 4 as a_1",
    "select 1 as run_id, 'x' as metric",
]


@pytest.mark.parametrize("sql", QUERIES)
def test_executed_frame_names_columns_as_the_relation_does(sql):
    con = store.scratch()
    small = store.frame(con, sql, rows=1)  # executed
    big = store.frame(con, sql, rows=store.EXECUTE_ROWS_MAX + 1)  # a relation
    assert small.columns == big.columns
    assert small.rows() == big.rows()


def test_unique_names_leaves_unique_names_alone():
    names = ["run_id", "metric", "p50", "P90"]
    assert store.unique_names(names) == names


def test_reading_rows_as_arrow_warns_of_nothing():
    con = store.scratch()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert store.arrow(con.execute("select 42 as v")).to_pylist() == [{"v": 42}]


def test_other_threads_filters_survive_concurrent_reads():
    """catch_warnings saves and restores the whole filter list: a read that wraps itself in one
    can put back a list from before another thread's filter, which is then lost."""
    con = store.scratch()
    stop = threading.Event()

    def reader() -> None:
        cur = con.cursor()
        while not stop.is_set():
            store.arrow(cur.execute("select range as v from range(2000)"))

    with warnings.catch_warnings():  # this test's own filters go with it
        threads = [threading.Thread(target=reader) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            for i in range(300):
                warnings.filterwarnings("error", f"tracelat test filter {i}", ResourceWarning)
        finally:
            stop.set()
            for t in threads:
                t.join()
        kept = {f[1].pattern for f in warnings.filters if f[1] is not None}
        lost = [i for i in range(300) if f"tracelat test filter {i}" not in kept]
        assert lost == []
