"""vLLM data-parallel dummy steps (" (dummy)" lines) are kept out of the fit and the stall flags.

A data-parallel engine with nothing scheduled runs a dummy forward pass so that its
collectives stay in step with the other engines; vLLM logs it as an ``Iteration`` line with
zero tokens and a trailing ``(dummy)``. Its elapsed time is the wait for the executor, not
work, so it must not pull the fitted fixed cost up nor count as a stall.
"""

from __future__ import annotations

import numpy as np
import pytest

T0, B, C = 5.0, 0.03, 0.2  # ms, ms per prefill token, ms per decode token (the log has no context tokens)


def _log(n: int, dummy_every: int | None, dummy_as_plain: bool = False) -> str:
    """An epoch-stamped vLLM frontend log of ``n`` real steps; every ``dummy_every``-th gap holds a
    dummy step of 25 ms (marked " (dummy)", or unmarked when ``dummy_as_plain``)."""
    rng = np.random.default_rng(7)
    lines, t, it = [], 1_796_000_000.0, 0
    for k in range(n):
        if dummy_every and k % dummy_every == 0:
            t += 0.030
            mark = "" if dummy_as_plain else " (dummy)"
            lines.append(
                f"{t:.6f} INFO [loggers.py:231] Engine 000: Iteration({it}): 0 context requests, 0 context "
                f"tokens, 0 generation requests, 0 generation tokens, iteration elapsed time: 25.00 ms, "
                f"GPU KV cache usage: 10.0%{mark}"
            )
            it += 1
        pf = int(rng.choice([0, 0, 0, 256, 512]))
        dec = int(rng.integers(1, 64))
        ms = (T0 + B * pf + C * dec) * float(np.exp(rng.normal(0, 0.02)))
        t += ms / 1000 + 0.001
        lines.append(
            f"{t:.6f} INFO [loggers.py:231] Engine 000: Iteration({it}): {1 if pf else 0} context requests, "
            f"{pf} context tokens, {dec} generation requests, {dec} generation tokens, iteration elapsed "
            f"time: {ms:.2f} ms, GPU KV cache usage: 10.0%"
        )
        it += 1
    return "\n".join(lines) + "\n"


def _fit(tmp_path, name: str, text: str):
    from pipeline import store
    from pipeline.fit.run import fit_run
    from pipeline.ingest import ingest_paths

    p = tmp_path / f"{name}.log"
    p.write_text(text)
    con = store.connect(tmp_path / f"{name}.duckdb")
    ingest_paths(con, [p], run_id=name, fmt="vllm-log")
    store.build_derived(con)
    return con, fit_run(con, name, n_boot=20)


@pytest.fixture(scope="module")
def fits(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dummy")
    return {
        name: _fit(tmp, name, _log(400, every, plain))
        for name, every, plain in (("clean", None, False), ("dummy", 3, False), ("plain", 3, True))
    }


@pytest.mark.long
def test_dummy_steps_do_not_change_the_fit(fits):
    _, clean = fits["clean"]
    con, dummy = fits["dummy"]
    n_dummy = con.execute(
        "select count(*) from iterations where json_extract(extra, '$.is_dummy')::boolean"
    ).fetchall()[0][0]
    assert n_dummy == 134  # steps 0, 3, ..., 399 have a dummy step before them
    for key in ("t0_ms", "b_ms_per_prefill", "c_ms_per_decode"):
        assert getattr(dummy, key) == pytest.approx(getattr(clean, key), rel=1e-12), key
    assert dummy.n_fitted == clean.n_fitted == 400
    assert dummy.n_iterations == 534
    assert any(s.startswith("134 of 534 steps are data-parallel dummy steps") for s in dummy.statements)
    assert not any("dummy" in s for s in clean.statements)
    # the fit recovers the truth (the log carries 2 % noise)
    assert dummy.t0_ms == pytest.approx(T0, rel=0.05) and dummy.c_ms_per_decode == pytest.approx(C, rel=0.05)


def test_the_same_steps_unmarked_would_bias_the_fixed_cost(fits):
    """Control: the same 25 ms zero-token steps without the mark are fitted and move t0."""
    _, clean = fits["clean"]
    _, plain = fits["plain"]
    assert plain.n_fitted == 534
    assert abs(plain.t0_ms - clean.t0_ms) > 0.1  # ms; the marked run above matches to 1e-12


def test_dummy_steps_get_no_prediction_and_are_never_stalls(fits):
    con, dummy = fits["dummy"]
    rows = con.execute(
        "select f.predicted_ms is null, f.is_stall, f.is_spike, count(*) from iteration_fit f "
        "join iterations i using (run_id, iter) where f.run_id = 'dummy' "
        "and json_extract(i.extra, '$.is_dummy')::boolean group by all"
    ).fetchall()
    assert rows == [(True, False, False, 134)]
    n_real = con.execute(
        "select count(*) from iteration_fit where run_id = 'dummy' and predicted_ms is not null"
    ).fetchall()[0][0]
    assert n_real == 400
