"""The store checks the property tests rest on find what they look for."""

from __future__ import annotations

from pipeline import store

from .props import non_finite


def test_non_finite_names_each_column_and_counts_its_rows(tmp_path):
    con = store.connect(tmp_path / "s.duckdb")
    assert non_finite(con) == {}
    con.execute(
        "insert into iterations (run_id, t_start, dur_ms) values ('r', 'nan', 1.0), ('r', 1.0, 'inf'), ('r', 2.0, '-inf')"
    )
    con.execute("insert into token_lists values ('r', 'a', [1.0, 'nan'::double], 1), ('r', 'b', [1.0, 2.0], 1)")
    # a histogram's +Inf bucket is a bound by definition; -inf and NaN there are not
    con.execute(
        "insert into metric_samples (run_id, le, value) values ('r', 'inf', 1.0), ('r', '-inf', 1.0), ('r', 'nan', 'inf')"
    )
    assert non_finite(con) == {
        "iterations.t_start": 1,
        "iterations.dur_ms": 2,
        "token_lists.t_s": 1,
        "tokens.t": 1,  # the view over token_lists, one row per token
        "tokens.itl_ms": 1,  # the gap to the NaN
        "metric_samples.le": 2,
        "metric_samples.value": 1,
    }
    con.close()
