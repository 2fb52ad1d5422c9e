"""Property-based tests of canonical ingest (issue 15's fuzz suite, its generated half).

Hypothesis generates VALID canonical traces (requests with arrival <= scheduled <=
first token <= finish, token times in order between them, steps of non-negative
duration, any Unicode ids) and checks, for every one:

- they ingest with 0 rejects, as JSON Lines and as Parquet;
- the summary's TTFT / TPOT / E2E / queue / ITL / iteration-time statistics equal
  numpy's, computed here from the generated values (count, mean, sample std, min,
  max and every percentile with numpy's default linear interpolation);
- ingest is idempotent and order-independent: the same records, re-ingested or
  shuffled (each carrying its run id), give the same summary JSON, byte for byte;
- every number stored, base tables and derived, is finite.

The default run tries a few dozen traces per property with a fixed seed
(``derandomize``), so CI sees the same cases every time; ``-m slow`` tries many more
(``TRACELAT_PROP_EXAMPLES=N`` sets the number).
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import ingest, store
from pipeline import summary as run_summary
from pipeline.jsonplain import plain

from .props import assert_store_finite, budgets

RUN = "prop-run"
# few cases by default (each is a store, an ingest and a summary: ~0.5 s of CPU); many with -m slow
FEW, MANY = 12, 100  # slow: 100 JSONL + 50 Parquet traces; TRACELAT_PROP_EXAMPLES=N for long runs
PERCENTILES = {"p50": 50, "p90": 90, "p95": 95, "p99": 99, "p999": 99.9}


def _settings(n: int):
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


BUDGETS = budgets(FEW, MANY)

# ids: any Unicode text (quotes, backslashes, control characters, astral planes), or integers
ids = st.one_of(st.text(min_size=1, max_size=12), st.integers(0, 2**53))
# seconds on a monotonic clock, far enough from the 1e11 s plausibility bound
starts = st.floats(0, 1e6, allow_nan=False, allow_infinity=False)
spans = st.floats(0, 600, allow_nan=False, allow_infinity=False)


@st.composite
def requests(draw, t0: float) -> dict:
    a = t0 + draw(st.floats(0, 100))
    s = a + draw(st.floats(0, 5))
    f = s + draw(st.floats(0, 60))
    c = f + draw(spans)
    n = draw(st.integers(1, 40))
    rec = {
        "kind": "request",
        "t_arrival": a,
        "t_scheduled": s,
        "t_first_token": f,
        "t_finish": c,
        "prompt_tokens": draw(st.integers(0, 100_000)),
        "output_tokens": n,
    }
    status = draw(st.sampled_from([None, "ok", "ok", "error", "aborted"]))
    if status is not None:
        rec["status"] = status
    if draw(st.booleans()):
        # n token times from f to c, non-decreasing (fractions of the span, sorted; repeats allowed)
        inner = sorted(draw(st.lists(st.floats(0, 1), min_size=max(n - 2, 0), max_size=max(n - 2, 0))))
        rec["token_times"] = [f] + [f + (c - f) * x for x in inner] + ([c] if n > 1 else [])
    return rec


@st.composite
def steps(draw, t0: float) -> dict:
    t_start = t0 + draw(st.floats(0, 100))
    rec = {
        "kind": "iteration",
        "t_start": t_start,
        "t_end": t_start + draw(st.floats(0, 10)),
        "decode_tokens": draw(st.integers(0, 512)),
        "prefill_tokens": draw(st.integers(0, 8192)),
    }
    if draw(st.booleans()):
        rec["kv_usage"] = draw(st.floats(0, 1))
    return rec


@st.composite
def traces(draw) -> list[dict]:
    """A run record, then steps and requests (at least one of either) with unique ids."""
    t0 = draw(starts)
    reqs = draw(st.lists(requests(t0), max_size=12))
    its = draw(st.lists(steps(t0), min_size=0 if reqs else 1, max_size=12))
    req_ids = draw(st.lists(ids, min_size=len(reqs), max_size=len(reqs), unique_by=str))
    iters = draw(st.lists(st.integers(0, 2**31), min_size=len(its), max_size=len(its), unique=True))
    for r, i in zip(reqs, req_ids):
        r["req_id"] = i
    for s, i in zip(its, iters):
        s["iter"] = i
    run = {
        "kind": "run",
        "run_id": RUN,
        "engine": "hypothesis",
        "model": draw(st.text(max_size=20)),
        "clock": "monotonic",
    }
    return [run, *its, *reqs]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_parquet(path: Path, records: list[dict]) -> Path:
    """The same records as rows of one Parquet table (canonical column names)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = {
        "kind": pa.string(),
        "run_id": pa.string(),
        "engine": pa.string(),
        "model": pa.string(),
        "clock": pa.string(),
        "iter": pa.int64(),
        "t_start": pa.float64(),
        "t_end": pa.float64(),
        "decode_tokens": pa.int64(),
        "prefill_tokens": pa.int64(),
        "kv_usage": pa.float64(),
        "req_id": pa.string(),
        "t_arrival": pa.float64(),
        "t_scheduled": pa.float64(),
        "t_first_token": pa.float64(),
        "t_finish": pa.float64(),
        "prompt_tokens": pa.int64(),
        "output_tokens": pa.int64(),
        "status": pa.string(),
        "token_times": pa.list_(pa.float64()),
    }
    rows = [{k: (str(v) if k == "req_id" else v) for k, v in r.items()} for r in records]
    table = pa.table({k: pa.array([r.get(k) for r in rows], type=t) for k, t in cols.items()})
    pq.write_table(table, path)
    return path


def _stats(values: list[float]) -> dict:
    """The summary's statistics of one metric, by numpy (None where it has none)."""
    x = np.asarray(values, dtype=float)
    if not len(x):
        return {"count": 0}
    out = {
        "count": len(x),
        "mean": float(np.mean(x)),
        "min": float(x.min()),
        "max": float(x.max()),
        "std": float(np.std(x, ddof=1)) if len(x) > 1 else None,
    }
    out |= {k: float(np.percentile(x, q)) for k, q in PERCENTILES.items()}
    return out


def expected_metrics(records: list[dict]) -> dict[str, dict]:
    """Each metric's values from the generated records, by the formulas of docs/metrics.md."""
    ok = [r for r in records if r["kind"] == "request" and r.get("status", "ok") == "ok"]
    vals = {
        "ttft_ms": [(r["t_first_token"] - r["t_arrival"]) * 1000 for r in ok],
        "queue_ms": [(r["t_scheduled"] - r["t_arrival"]) * 1000 for r in ok],
        "e2e_ms": [(r["t_finish"] - r["t_arrival"]) * 1000 for r in ok],
        "tpot_ms": [
            (r["t_finish"] - r["t_first_token"]) * 1000 / (r["output_tokens"] - 1) for r in ok if r["output_tokens"] > 1
        ],
        "itl_ms": [(b - a) * 1000 for r in ok for a, b in zip(r.get("token_times", []), r.get("token_times", [])[1:])],
        "iteration_ms": [(s["t_end"] - s["t_start"]) * 1000 for s in records if s["kind"] == "iteration"],
    }
    return {m: _stats(v) for m, v in vals.items()}


def _close(got, want) -> bool:
    if want is None or got is None:
        return got is want
    # same formulas on the same doubles: only the order of additions may differ
    return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9 * max(1.0, abs(want)))


def ingest_and_summarize(con, path: Path, **kw) -> dict:
    (res,) = ingest.ingest_paths(con, [path], **kw)
    assert res.rejected == 0 and res.skipped == 0, con.execute("select line_no, reason from rejects").fetchall()
    assert res.accepted == res.lines_read
    store.build_derived(con)
    return run_summary.summary(con, RUN)


def summary_bytes(s: dict) -> str:
    return json.dumps(plain(s), sort_keys=True, indent=1)


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("form", ["jsonl", "parquet"])
def test_valid_traces_load_whole_and_match_numpy(form, budget, tmp_path):
    """(b) and (d): every record accepted, statistics = numpy's, every stored number finite."""
    writer = write_jsonl if form == "jsonl" else write_parquet

    # Parquet rows meet the same SQL as JSON lines once read: half the cases
    @_settings(budget if form == "jsonl" else budget // 2)
    @given(records=traces())
    def prop(records):
        con = store.connect(":memory:")
        try:
            s = ingest_and_summarize(con, writer(tmp_path / f"t.{form}", records), fmt=form)
            reqs = [r for r in records if r["kind"] == "request"]
            n_ok = sum(r.get("status", "ok") == "ok" for r in reqs)
            assert (s["requests"], s["requests_ok"], s["iterations"]) == (len(reqs), n_ok, len(records) - 1 - len(reqs))
            for metric, want in expected_metrics(records).items():
                got = s[metric]
                assert got["count"] == want["count"], (metric, got, want)
                for k, w in want.items():
                    assert _close(got[k], w), (metric, k, got[k], w)
            if reqs:  # duration: first arrival to last finish (ok or not: the run's whole span)
                span = max(r["t_finish"] for r in reqs) - min(r["t_arrival"] for r in reqs)
                assert _close(s["duration_s"], span)
            assert_store_finite(con)
        finally:
            con.close()

    prop()


@pytest.mark.parametrize("budget", budgets(6, MANY // 2))  # each case is four ingests
def test_ingest_is_idempotent_and_order_independent(budget, tmp_path):
    """(c): re-ingest (unchanged, then --replace) and a shuffled copy give the same summary bytes."""

    @_settings(budget)
    @given(records=traces(), seed=st.integers(0, 2**32 - 1))
    def prop(records, seed):
        first = store.connect(":memory:")
        other = store.connect(":memory:")
        try:
            path = write_jsonl(tmp_path / "a.jsonl", records)
            want = summary_bytes(ingest_and_summarize(first, path))
            (again,) = ingest.ingest_paths(first, [path])
            assert again.status == "unchanged"
            store.build_derived(first)
            assert summary_bytes(run_summary.summary(first, RUN)) == want
            assert summary_bytes(ingest_and_summarize(first, path, replace=True)) == want
            # every record names its run, so any order means the same records
            shuffled = [r | {"run_id": RUN} for r in records]
            random.Random(seed).shuffle(shuffled)
            got = summary_bytes(ingest_and_summarize(other, write_jsonl(tmp_path / "b.jsonl", shuffled)))
            assert got == want
        finally:
            first.close()
            other.close()

    prop()
