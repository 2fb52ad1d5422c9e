"""metric_stats.sql: mean and std from exact fixed-point sums, checked against numpy on hard inputs."""

from __future__ import annotations

import math
from fractions import Fraction

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from pipeline import store


def _inputs(threads: int) -> duckdb.DuckDBPyConnection:
    """A connection with empty tables of every input of metric_stats.sql."""
    con = duckdb.connect()
    con.execute(f"set threads = {threads}")
    con.execute("create table iteration_metrics (run_id varchar, iteration_ms double)")
    con.execute("create table request_latency (run_id varchar, status varchar, ttft_ms double)")
    con.execute("create table requests (run_id varchar, req_id varchar, status varchar)")
    con.execute("create table token_lists (run_id varchar, req_id varchar, t_s double[])")
    return con


def _row(con: duckdb.DuckDBPyConnection, metric: str) -> tuple:
    row = con.execute(
        "select count, mean, std, min, max, p50, p99 from (" + store.query_text("metric_stats") + ") where metric = ?",
        [metric],
    ).fetchall()
    assert len(row) == 1
    return row[0]


def _stats(values: np.ndarray, shuffle_seed: int | None = None, threads: int = 4) -> tuple:
    """metric_stats of ``values`` as one run's iteration_ms (the other inputs empty)."""
    if shuffle_seed is not None:
        values = np.random.default_rng(shuffle_seed).permutation(values)
    con = _inputs(threads)
    # inputs as Arrow tables, not bound parameters: DuckDB 1.5 (the floor) took a minute to bind
    # a Python list of a few hundred thousand numbers
    con.register("v", pa.table({"v": values}))
    con.execute("insert into iteration_metrics select 'r', v from v")
    return _row(con, "iteration_ms")


def _itl_stats(lists: list[np.ndarray], shuffle_seed: int | None = None, threads: int = 4) -> tuple:
    """metric_stats' itl_ms of requests whose token times are ``lists`` (in any order of the requests)."""
    order = range(len(lists)) if shuffle_seed is None else np.random.default_rng(shuffle_seed).permutation(len(lists))
    con = _inputs(threads)
    ordered = [lists[i] for i in order]
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in ordered])]).astype(np.int32)
    con.register(
        "given",
        pa.table(
            {
                "req_id": pa.array([str(int(i)) for i in order]),
                "t_s": pa.ListArray.from_arrays(offsets, np.concatenate(ordered)),
            }
        ),
    )
    con.execute("insert into token_lists select 'r', req_id, t_s from given")
    # a request that failed: its gaps are no ITL
    con.execute("insert into requests select 'r', req_id, 'ok' from token_lists")
    con.execute("insert into token_lists values ('r', 'failed', [0.0, 1000.0])")
    con.execute("insert into requests values ('r', 'failed', 'error')")
    return _row(con, "itl_ms")


CASES = {
    "lognormal": np.random.default_rng(1).lognormal(2.0, 0.8, 50_000),
    # epoch-sized values with microsecond noise: a naive sum of squares cancels to garbage
    "big offset": 1.7e9 + np.random.default_rng(2).normal(0, 1e-3, 20_000),
    # one outlier sets the range; the rest sit within 1e-6 of each other
    "outlier": np.concatenate([np.full(10_000, 5.0) + np.random.default_rng(3).normal(0, 1e-6, 10_000), [1e6]]),
    "tiny": np.random.default_rng(4).uniform(1e-9, 2e-9, 5_000),
    "negative": np.random.default_rng(5).normal(-40.0, 25.0, 30_000),
}


def _exact(xs: np.ndarray) -> tuple[float, float]:
    """Mean and sample std of the doubles in ``xs``, in exact rational arithmetic, then rounded.

    Each double is an integer times 2**base for the smallest exponent among them, so the sums
    are of Python integers (exact, and 10x faster than summing Fractions over 600k gaps).
    """
    assert np.isfinite(xs).all()
    frac, exp = np.frexp(xs)  # x = frac * 2**exp exactly, frac of 53 bits
    mant = (frac * 2.0**53).astype(np.int64)  # exact: a scaling by a power of two
    exp = exp.astype(np.int64) - 53
    base = int(exp.min())
    ints = [m << s for m, s in zip(mant.tolist(), (exp - base).tolist())]
    n, total = len(ints), sum(ints)
    scale = Fraction(2) ** base
    mean = Fraction(total, n) * scale
    # sum((x - mean)**2) = sum((n*v - total)**2) / n**2, in units of scale**2
    num, den = sum((n * v - total) ** 2 for v in ints), n * n * (n - 1)
    # the root in integers too, to 64 bits below its leading one (a float's sqrt of the rounded
    # variance would underflow on subnormal inputs)
    k = max(0, (den.bit_length() - num.bit_length()) // 2 + 64)
    root = math.isqrt((num << (2 * k)) // den)
    return float(mean), float(Fraction(root) * scale * Fraction(2) ** -k)


@pytest.mark.parametrize("name", sorted(CASES))
def test_mean_and_std_equal_exact_arithmetic(name):
    """Both to about the last bit; numpy's own std is off by 2e-9 on the big-offset case."""
    xs = CASES[name]
    count, mean, std, lo, hi, p50, p99 = _stats(xs)
    exact_mean, exact_std = _exact(xs)
    assert count == len(xs)
    assert mean == pytest.approx(exact_mean, rel=1e-15)
    assert std == pytest.approx(exact_std, rel=1e-12)
    assert (lo, hi) == (xs.min(), xs.max())
    assert p50 == pytest.approx(np.percentile(xs, 50), rel=1e-15)
    assert p99 == pytest.approx(np.percentile(xs, 99), rel=1e-15)


def _token_lists(seed: int, n: int = 3000) -> list[np.ndarray]:
    """Token times of ``n`` requests: epoch-sized starts, lognormal gaps of a few ms, 1 to 400 tokens."""
    rng = np.random.default_rng(seed)
    return [
        1.7e9 + rng.uniform(0, 600) + np.cumsum(np.concatenate([[0.0], rng.lognormal(-5.0, 0.6, rng.integers(0, 400))]))
        for _ in range(n)
    ]


def test_itl_from_token_lists_equals_exact_arithmetic_over_every_gap():
    lists = _token_lists(6)
    gaps = np.concatenate([np.diff(t) * 1000 for t in lists])
    count, mean, std, lo, hi, p50, p99 = _itl_stats(lists)
    exact_mean, exact_std = _exact(gaps)
    assert count == len(gaps)  # the failed request's gap is left out
    assert mean == pytest.approx(exact_mean, rel=1e-14)
    assert std == pytest.approx(exact_std, rel=1e-12)
    assert (lo, hi) == (gaps.min(), gaps.max())
    assert p50 == pytest.approx(np.percentile(gaps, 50), rel=1e-15)
    assert p99 == pytest.approx(np.percentile(gaps, 99), rel=1e-15)


def test_itl_in_any_order_of_requests_gives_the_same_bits():
    lists = _token_lists(7)
    first = _itl_stats(lists, threads=4)
    for seed, threads in ((1, 1), (2, 2), (3, 8)):
        assert _itl_stats(lists, shuffle_seed=seed, threads=threads) == first


def test_same_values_in_any_order_give_the_same_bits():
    xs = CASES["lognormal"]
    first = _stats(xs, shuffle_seed=None, threads=4)
    for seed, threads in ((1, 1), (2, 2), (3, 4), (4, 8)):
        assert _stats(xs, shuffle_seed=seed, threads=threads) == first


def test_constant_values_have_their_value_as_mean_and_zero_std():
    count, mean, std, lo, hi, *_ = _stats(np.full(7, 0.1))
    assert (count, mean, std, lo, hi) == (7, 0.1, 0.0, 0.1, 0.1)
    count, mean, std, *_ = _stats(np.array([3.25]))
    assert (count, mean, std) == (1, 3.25, None)
