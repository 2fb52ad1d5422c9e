"""Simulator core: checked against a naive reference scheduler and independent invariants."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest

from pipeline.sim import NO_NOISE, IterationModel, NoiseModel, Policy, Workload, add_burst, poisson_workload
from pipeline.sim.engine import NOISE_CHUNK, simulate, token_times

MODEL = IterationModel(t0_ms=5.0, a_ms_per_ctx=0.001, b_ms_per_prefill=0.02, c_ms_per_decode=0.01)


def reference_simulate(w, policy, model, noise, seed):
    """A deliberately naive scheduler that loops over every running request each step.

    It follows the rules in the engine docstring with per-request state and
    per-token lists, to check the engine's aggregate bookkeeping. Small inputs only.
    """
    rng = np.random.default_rng(seed)
    n = len(w)
    P = [int(x) for x in w.prompt_tokens]
    O = [int(x) for x in w.output_tokens]
    M, S, cap = policy.max_num_batched_tokens, policy.max_num_seqs, policy.kv_capacity_tokens
    stored = [0] * n  # KV tokens held
    gen = [0] * n
    prefilling = [True] * n
    tokens = [[] for _ in range(n)]
    t_sched = [math.nan] * n
    preempt_count = [0] * n
    running: list[int] = []  # admission order
    waiting: deque[int] = deque()
    rows = []
    nxt, clock, k = 0, 0.0, 0
    fac, stl = [], []
    while True:
        if k % NOISE_CHUNK == 0:
            f, s = noise.draw(rng, NOISE_CHUNK)
            fac, stl = f.tolist(), s.tolist()
        if not running and not waiting:
            if nxt >= n:
                break
            clock = max(clock, float(w.t_arrival[nxt]))
        while nxt < n and w.t_arrival[nxt] <= clock:
            waiting.append(nxt)
            nxt += 1
        preempted = 0
        pf_sched: list[tuple[int, int]] = []

        def decoders():
            return [r for r in running if not prefilling[r]]

        def kv_after():
            return (sum(P[r] + gen[r] for r in decoders())
                    + sum(stored[r] for r in running if prefilling[r])
                    + sum(c for _, c in pf_sched))

        while True:
            done_ids = {r for r, _ in pf_sched}
            pending = [r for r in running if prefilling[r] and r not in done_ids]
            chunk, r = 0, None
            if pending:
                r = pending[0]
                budget = M - len(decoders()) - sum(c for _, c in pf_sched)
                chunk = min(P[r] + gen[r] - stored[r], budget)
            if kv_after() + chunk <= cap:
                if chunk <= 0:
                    break
                pf_sched.append((r, chunk))
                continue
            v = running.pop()
            stored[v] = 0  # recompute: KV freed, generated tokens kept
            prefilling[v] = True
            preempt_count[v] += 1
            preempted += 1
            waiting.appendleft(v)
        if not preempted:
            while waiting and len(running) < S:
                r = waiting[0]
                L = P[r] + gen[r]
                budget = M - len(decoders()) - sum(c for _, c in pf_sched)
                if policy.chunked_prefill:
                    if budget <= 0:
                        break
                    chunk = min(L, budget)
                elif L <= budget or (L > M and not pf_sched):
                    chunk = L
                else:
                    break
                if kv_after() + chunk > cap:
                    break
                waiting.popleft()
                running.append(r)
                prefilling[r] = True
                stored[r] = 0
                if t_sched[r] != t_sched[r]:
                    t_sched[r] = clock
                pf_sched.append((r, chunk))
                if chunk < L:
                    break
        decs = decoders()
        ctx = sum(P[r] + gen[r] for r in decs) + sum(stored[r] for r, _ in pf_sched)
        pf = sum(c for _, c in pf_sched)
        kv = kv_after()
        base = model.t0_ms + model.a_ms_per_ctx * ctx + model.b_ms_per_prefill * pf + model.c_ms_per_decode * len(decs)
        j = k % NOISE_CHUNK
        t_start = clock
        clock = t_start + (base * fac[j] + stl[j]) * 1e-3
        rows.append(dict(t_start=t_start, t_end=clock, prefill_tokens=pf, prefill_reqs=len(pf_sched),
                         decode_tokens=len(decs), context_tokens=ctx, running_reqs=len(running),
                         waiting_reqs=len(waiting), kv_usage=kv / cap, preempted_reqs=preempted, base_ms=base))
        finished = []
        for r in decs:
            stored[r] += 1
            gen[r] += 1
            tokens[r].append(clock)
            if gen[r] == O[r]:
                finished.append(r)
        for r, c in pf_sched:
            stored[r] += c
            if stored[r] == P[r] + gen[r]:
                prefilling[r] = False
                gen[r] += 1
                tokens[r].append(clock)
                if gen[r] == O[r]:
                    finished.append(r)
        for r in finished:
            running.remove(r)
        k += 1
    return rows, tokens, t_sched, preempt_count


def small_workload(n=120, rate=40.0, seed=3, prompt=300, output=40):
    return poisson_workload(n, rate, prompt, 0.9, output, 0.9, seed=seed)


CASES = {
    "chunked": Policy(max_num_seqs=16, max_num_batched_tokens=256, kv_capacity_tokens=100_000),
    "chunked-kv-tight": Policy(max_num_seqs=16, max_num_batched_tokens=256, kv_capacity_tokens=3_000),
    "whole-prompts-kv-tight": Policy(max_num_seqs=8, max_num_batched_tokens=512, kv_capacity_tokens=3_000,
                                     chunked_prefill=False),
    "few-seqs": Policy(max_num_seqs=3, max_num_batched_tokens=64, kv_capacity_tokens=100_000),
}


def _check_fits(w, policy):
    keep = w.prompt_tokens + w.output_tokens - 1 <= policy.kv_capacity_tokens
    return Workload(w.t_arrival[keep], w.prompt_tokens[keep], w.output_tokens[keep])


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("noise", [NO_NOISE, NoiseModel(sigma=0.2, stall_rate=0.05, stall_ms_mean=20)])
def test_matches_naive_reference(name, noise):
    policy = CASES[name]
    w = _check_fits(add_burst(small_workload(), 0.5, 4, 1500, 20), policy)
    res = simulate(w, policy, MODEL, noise, seed=11)
    rows, tokens, t_sched, npre = reference_simulate(w, policy, MODEL, noise, seed=11)
    it = res.iterations
    assert res.n_iterations == len(rows)
    for f in rows[0]:
        assert it[f].tolist() == [r[f] for r in rows], f
    assert res.requests["t_scheduled"].tolist() == t_sched
    assert res.requests["preemptions"].tolist() == npre
    got = token_times(res)
    assert [g.tolist() for g in got] == tokens
    if name.endswith("kv-tight"):
        assert it["preempted_reqs"].sum() > 0  # the case exercises preemption


def run_invariants(res, w, policy):
    it, rq = res.iterations, res.requests
    assert np.all(it["running_reqs"] <= policy.max_num_seqs)
    assert np.all(it["kv_usage"] <= 1.0 + 1e-12)
    assert np.all(it["t_end"] > it["t_start"])
    assert np.all(it["t_start"][1:] >= it["t_end"][:-1])
    assert np.all(it["decode_tokens"] == it["decode_reqs"])
    assert np.all(rq["status"] == "ok")
    for r, tt in enumerate(token_times(res)):
        assert len(tt) == rq["output_tokens"][r]
        assert np.all(np.diff(tt) > 0)
        assert tt[0] == rq["t_first_token"][r] and tt[-1] == rq["t_finish"][r]
        assert rq["t_arrival"][r] <= rq["t_scheduled"][r] < rq["t_first_token"][r]
    assert rq["preemptions"].sum() == it["preempted_reqs"].sum()


def test_invariants_under_load_with_preemption():
    policy = Policy(max_num_seqs=32, max_num_batched_tokens=512, kv_capacity_tokens=6_000)
    w = add_burst(poisson_workload(400, 60.0, 400, 1.0, 60, 1.0, seed=5), 2.0, 10, 3000, 30, spread_s=0.1)
    w = _check_fits(w, policy)
    res = simulate(w, policy, MODEL, NoiseModel(sigma=0.05), seed=1)
    run_invariants(res, w, policy)
    it = res.iterations
    assert np.all(it["prefill_tokens"] + it["decode_tokens"] <= policy.max_num_batched_tokens)
    assert it["preempted_reqs"].sum() > 0
    assert res.requests["preemptions"].max() >= 1


def _context_from_tokens(res):
    """Context per step rebuilt from token times and prefill chunks (no engine state)."""
    it, rq = res.iterations, res.requests
    ctx = np.zeros(res.n_iterations, dtype=np.int64)
    ch = res.prefill_chunks
    chunk_steps = {}
    for r, k in zip(ch["req"], ch["iter"]):
        chunk_steps.setdefault(int(r), set()).add(int(k))
    for r, tt in enumerate(token_times(res)):
        steps = np.searchsorted(it["t_end"], tt)
        assert np.array_equal(it["t_end"][steps], tt)
        for n_before, k in enumerate(steps):
            if k not in chunk_steps.get(r, ()):  # a decode step: prompt + tokens generated so far
                ctx[k] += rq["prompt_tokens"][r] + n_before
    return ctx


def test_context_tokens_match_token_times_whole_prompts():
    # whole prompts: every prefill is one chunk with no earlier context; preemption re-prefills
    policy = Policy(max_num_seqs=12, max_num_batched_tokens=1024, kv_capacity_tokens=4_000, chunked_prefill=False)
    w = _check_fits(small_workload(200, 50.0), policy)
    res = simulate(w, policy, MODEL, NO_NOISE, seed=2)
    assert res.iterations["preempted_reqs"].sum() > 0
    assert np.array_equal(res.iterations["context_tokens"], _context_from_tokens(res))
    assert np.all(res.prefill_chunks["computed_before"] == 0)


def test_context_tokens_match_token_times_chunked():
    # no KV pressure: a chunk's context is the sum of the request's earlier chunks
    policy = Policy(max_num_seqs=12, max_num_batched_tokens=128, kv_capacity_tokens=10**7)
    res = simulate(small_workload(150, 30.0), policy, MODEL, NO_NOISE, seed=2)
    ctx = _context_from_tokens(res)
    ch = res.prefill_chunks
    seen: dict[int, int] = {}
    for r, k, t in zip(ch["req"].tolist(), ch["iter"].tolist(), ch["tokens"].tolist()):
        ctx[k] += seen.get(r, 0)
        seen[r] = seen.get(r, 0) + t
    assert np.array_equal(res.iterations["context_tokens"], ctx)
    assert np.all(res.iterations["prefill_tokens"] + res.iterations["decode_tokens"] <= 128)
    assert max(np.bincount(ch["req"])) > 1  # some prompt was split


def test_iteration_time_is_the_model_formula_without_noise():
    res = simulate(small_workload(), CASES["chunked"], MODEL, NO_NOISE, seed=0)
    it = res.iterations
    base = MODEL.base_ms(it["context_tokens"], it["prefill_tokens"], it["decode_tokens"])
    assert np.array_equal(it["base_ms"], base)
    np.testing.assert_allclose((it["t_end"] - it["t_start"]) * 1000, base, rtol=1e-9, atol=1e-9)
    assert np.all(it["stall_ms"] == 0)


def test_noise_is_mean_one_lognormal():
    sigma = 0.1
    w = poisson_workload(3000, 50.0, 200, 0.5, 50, 0.5, seed=1)
    res = simulate(w, Policy(), MODEL, NoiseModel(sigma=sigma), seed=4)
    it = res.iterations
    factor = (it["t_end"] - it["t_start"]) * 1000 / it["base_ms"]
    assert res.n_iterations > 2000
    assert abs(np.log(factor).std() - sigma) < 0.01
    assert abs(factor.mean() - 1) < 0.01


def test_stalls_are_exactly_the_slow_iterations():
    noise = NoiseModel(sigma=0.0, stall_rate=0.02, stall_ms_mean=30.0)
    res = simulate(small_workload(300), Policy(), MODEL, noise, seed=9)
    it = res.iterations
    excess = (it["t_end"] - it["t_start"]) * 1000 - it["base_ms"]
    slow = np.flatnonzero(excess > 1e-6)
    assert len(slow) > 5
    assert slow.tolist() == np.flatnonzero(it["stall_ms"] > 0).tolist()
    np.testing.assert_allclose(excess[slow], it["stall_ms"][slow], rtol=1e-6)


def test_deterministic_for_a_seed():
    w = small_workload()
    noise = NoiseModel(sigma=0.1, stall_rate=0.01)
    a = simulate(w, CASES["chunked-kv-tight"], MODEL, noise, seed=7)
    b = simulate(w, CASES["chunked-kv-tight"], MODEL, noise, seed=7)
    c = simulate(w, CASES["chunked-kv-tight"], MODEL, noise, seed=8)
    for f in a.iterations:
        assert np.array_equal(a.iterations[f], b.iterations[f])
    for f in a.requests:
        assert np.array_equal(a.requests[f], b.requests[f], equal_nan=f.startswith("t_"))
    assert not np.array_equal(a.iterations["t_end"], c.iterations["t_end"])


def test_fcfs_scheduling_order():
    res = simulate(small_workload(200, 80.0), Policy(max_num_seqs=4, max_num_batched_tokens=256), MODEL,
                   NO_NOISE, seed=0)
    ts = res.requests["t_scheduled"]
    assert np.all(np.diff(ts) >= 0)
    assert res.iterations["waiting_reqs"].max() > 0  # the queue was really used


def test_chunked_prefill_splits_a_long_prompt():
    w = Workload(np.array([0.0]), np.array([5000]), np.array([3]))
    res = simulate(w, Policy(max_num_seqs=4, max_num_batched_tokens=2048), MODEL, NO_NOISE, seed=0)
    it = res.iterations
    assert it["prefill_tokens"].tolist() == [2048, 2048, 904, 0, 0]
    assert it["context_tokens"].tolist() == [0, 2048, 4096, 5001, 5002]
    assert it["decode_tokens"].tolist() == [0, 0, 0, 1, 1]
    assert res.requests["t_first_token"][0] == it["t_end"][2]
    assert token_times(res, 0).tolist() == it["t_end"][2:].tolist()
    assert res.prefill_chunks["computed_before"].tolist() == [0, 2048, 4096]


def test_whole_prompt_longer_than_budget_runs_alone():
    w = Workload(np.array([0.0, 0.0, 0.0]), np.array([100, 5000, 100]), np.array([5, 2, 2]))
    res = simulate(w, Policy(max_num_seqs=8, max_num_batched_tokens=1024, chunked_prefill=False), MODEL,
                   NO_NOISE, seed=0)
    it = res.iterations
    big = np.flatnonzero(it["prefill_tokens"] == 5000)
    assert len(big) == 1 and it["prefill_reqs"][big[0]] == 1
    over = it["prefill_tokens"] + it["decode_tokens"] > 1024
    assert np.flatnonzero(over).tolist() == big.tolist()


def test_single_output_token_finishes_at_first_token_and_idle_jump():
    w = Workload(np.array([2.5, 10.0]), np.array([10, 10]), np.array([1, 2]))
    res = simulate(w, Policy(), MODEL, NO_NOISE, seed=0)
    rq, it = res.requests, res.iterations
    assert it["t_start"][0] == 2.5 and it["t_start"][1] == 10.0  # the clock jumps over idle time
    assert rq["t_finish"][0] == rq["t_first_token"][0] == it["t_end"][0]
    assert token_times(res, 0).tolist() == [it["t_end"][0]]


def test_stop_early_marks_unfinished_requests():
    w = small_workload(200, 40.0)
    full = simulate(w, CASES["chunked"], MODEL, NO_NOISE, seed=0)
    part = simulate(w, CASES["chunked"], MODEL, NO_NOISE, seed=0, max_iterations=100)
    assert part.n_iterations == 100 and part.info["stop"] == "max_iterations"
    assert np.array_equal(part.iterations["t_end"], full.iterations["t_end"][:100])
    assert part.n_requests < 200 and np.any(part.requests["status"] == "aborted")
    tt = token_times(part)
    for r in range(part.n_requests):
        assert len(tt[r]) <= part.requests["output_tokens"][r]
        assert (len(tt[r]) == part.requests["output_tokens"][r]) == (part.requests["status"][r] == "ok")
    timed = simulate(w, CASES["chunked"], MODEL, NO_NOISE, seed=0, t_end_s=1.0)
    assert timed.iterations["t_start"].max() < 1.0 <= full.iterations["t_end"][timed.n_iterations]


def test_request_larger_than_kv_is_rejected():
    from pipeline.errors import InputError

    w = Workload(np.array([0.0]), np.array([900]), np.array([200]))
    with pytest.raises(InputError, match="kv_capacity_tokens"):
        simulate(w, Policy(kv_capacity_tokens=1000), MODEL, NO_NOISE, seed=0)


def test_policy_validation():
    with pytest.raises(ValueError):
        Policy(max_num_seqs=512, max_num_batched_tokens=256)
