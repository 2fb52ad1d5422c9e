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
    per-token lists, to check the engine's aggregate bookkeeping. KV is counted
    per request in whole blocks, recomputed from every request's tokens each time.
    Small inputs only.
    """
    rng = np.random.default_rng(seed)
    n = len(w)
    P = [int(x) for x in w.prompt_tokens]
    O = [int(x) for x in w.output_tokens]
    M, S = policy.max_num_batched_tokens, policy.max_num_seqs
    bs = policy.kv_block_size
    cap = policy.kv_capacity_tokens // bs  # blocks

    def blocks(tokens):
        return math.ceil(tokens / bs)

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

        def kv_after(cand=None, cand_chunk=0):
            """Blocks held after the step, with ``cand`` given ``cand_chunk`` more tokens."""
            add = {}
            for r, c in pf_sched + ([(cand, cand_chunk)] if cand is not None else []):
                add[r] = add.get(r, 0) + c
            held = [P[r] + gen[r] for r in decoders()]
            held += [stored[r] + add.pop(r, 0) for r in running if prefilling[r]]
            held += list(add.values())  # a candidate not yet running
            return sum(blocks(t) for t in held)

        while True:
            done_ids = {r for r, _ in pf_sched}
            pending = [r for r in running if prefilling[r] and r not in done_ids]
            chunk, r = 0, None
            if pending:
                r = pending[0]
                budget = M - len(decoders()) - sum(c for _, c in pf_sched)
                chunk = min(P[r] + gen[r] - stored[r], budget)
            if kv_after(r, chunk) <= cap:
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
                if kv_after(r, L if policy.admit_full_prompt else chunk) > cap:
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
        rows.append(
            dict(
                t_start=t_start,
                t_end=clock,
                prefill_tokens=pf,
                prefill_reqs=len(pf_sched),
                decode_tokens=len(decs),
                context_tokens=ctx,
                running_reqs=len(running),
                waiting_reqs=len(waiting),
                kv_usage=kv / cap,
                preempted_reqs=preempted,
                base_ms=base,
            )
        )
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
    "whole-prompts-kv-tight": Policy(
        max_num_seqs=8, max_num_batched_tokens=512, kv_capacity_tokens=3_000, chunked_prefill=False
    ),
    "few-seqs": Policy(max_num_seqs=3, max_num_batched_tokens=64, kv_capacity_tokens=100_000),
    "chunked-blocks16-tight": Policy(
        max_num_seqs=16, max_num_batched_tokens=256, kv_capacity_tokens=3_000, kv_block_size=16
    ),
    "chunked-blocks128-tight": Policy(
        max_num_seqs=16, max_num_batched_tokens=200, kv_capacity_tokens=3_000, kv_block_size=128
    ),
    "whole-prompts-blocks7-tight": Policy(
        max_num_seqs=8, max_num_batched_tokens=512, kv_capacity_tokens=3_000, chunked_prefill=False, kv_block_size=7
    ),
    "chunked-blocks16-fullprompt-tight": Policy(
        max_num_seqs=16, max_num_batched_tokens=128, kv_capacity_tokens=3_000, kv_block_size=16, admit_full_prompt=True
    ),
    "chunked-fullprompt-kv-tight": Policy(
        max_num_seqs=16, max_num_batched_tokens=256, kv_capacity_tokens=3_000, admit_full_prompt=True
    ),
}


def _check_fits(w, policy):
    keep = w.prompt_tokens + w.output_tokens - 1 <= policy.kv_usable_tokens
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
    if name.endswith("tight"):
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
    res = simulate(
        small_workload(200, 80.0), Policy(max_num_seqs=4, max_num_batched_tokens=256), MODEL, NO_NOISE, seed=0
    )
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
    res = simulate(
        w, Policy(max_num_seqs=8, max_num_batched_tokens=1024, chunked_prefill=False), MODEL, NO_NOISE, seed=0
    )
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


def test_blocks_limit_admission_where_tokens_would_fit():
    # 4 blocks of 4 tokens: A and B (5 tokens = 2 blocks each) fill the cache, C (1 token) waits;
    # counted in tokens (11 of 16) all three would run at once
    w = Workload(np.zeros(3), np.array([5, 5, 1]), np.array([2, 2, 1]))
    blocks = simulate(
        w,
        Policy(max_num_seqs=4, max_num_batched_tokens=64, kv_capacity_tokens=16, kv_block_size=4),
        MODEL,
        NO_NOISE,
        seed=0,
    )
    it = blocks.iterations
    assert it["prefill_tokens"].tolist() == [10, 0, 1]
    assert it["decode_tokens"].tolist() == [0, 2, 0]
    assert it["kv_usage"].tolist() == [1.0, 1.0, 0.25]  # step 1: contexts of 6 tokens still fit in 2 blocks each
    assert it["waiting_reqs"].tolist() == [1, 1, 0]
    assert blocks.requests["t_first_token"][2] == it["t_end"][2]
    tokens = simulate(
        w, Policy(max_num_seqs=4, max_num_batched_tokens=64, kv_capacity_tokens=16), MODEL, NO_NOISE, seed=0
    )
    assert tokens.iterations["prefill_tokens"].tolist() == [11, 0]


def test_decode_crossing_a_block_boundary_preempts_the_newest():
    # 9 tokens = 2 blocks of 4. Step 0 prefills A (4 tokens, 1 block) and B (3 tokens, 1 block). In step 1 A's
    # decode has context 5: a second block; the cache is full, so B (newest) is preempted and recomputed
    # (prompt + its first token = 4 tokens) only after A finishes. In tokens, 5 + 4 <= 9: no preemption.
    w = Workload(np.zeros(2), np.array([4, 3]), np.array([3, 2]))
    res = simulate(
        w,
        Policy(max_num_seqs=4, max_num_batched_tokens=64, kv_capacity_tokens=9, kv_block_size=4),
        MODEL,
        NO_NOISE,
        seed=0,
    )
    it, rq = res.iterations, res.requests
    assert it["prefill_tokens"].tolist() == [7, 0, 0, 4]
    assert it["decode_tokens"].tolist() == [0, 1, 1, 0]
    assert it["preempted_reqs"].tolist() == [0, 1, 0, 0]
    assert it["running_reqs"].tolist() == [2, 1, 1, 1]
    assert it["waiting_reqs"].tolist() == [0, 1, 1, 0]
    assert it["kv_usage"].tolist() == [1.0, 1.0, 1.0, 0.5]
    assert it["context_tokens"].tolist() == [0, 5, 6, 0]
    assert rq["preemptions"].tolist() == [0, 1]
    assert token_times(res, 1).tolist() == [it["t_end"][0], it["t_end"][3]]
    tokens = simulate(
        w, Policy(max_num_seqs=4, max_num_batched_tokens=64, kv_capacity_tokens=9), MODEL, NO_NOISE, seed=0
    )
    assert tokens.iterations["preempted_reqs"].sum() == 0


def test_block_rounding_caps_concurrency():
    # 129-token contexts take 2 blocks of 128: 15 blocks hold 7 such requests, not 1920 // 130 = 14
    n = 30
    w = Workload(np.zeros(n), np.full(n, 129), np.full(n, 2))
    res = simulate(
        w,
        Policy(max_num_seqs=32, max_num_batched_tokens=8192, kv_capacity_tokens=1920, kv_block_size=128),
        MODEL,
        NO_NOISE,
        seed=0,
    )
    assert res.iterations["running_reqs"].max() == 7
    tok = simulate(
        w, Policy(max_num_seqs=32, max_num_batched_tokens=8192, kv_capacity_tokens=1920), MODEL, NO_NOISE, seed=0
    )
    assert tok.iterations["running_reqs"].max() == 1920 // 130


def test_request_larger_than_whole_blocks_is_rejected():
    from pipeline.errors import InputError

    # 1000 tokens of capacity in blocks of 300 hold 900 tokens: a 950-token request cannot run
    w = Workload(np.array([0.0]), np.array([900]), np.array([51]))
    simulate(w, Policy(kv_capacity_tokens=1000), MODEL, NO_NOISE, seed=0)
    with pytest.raises(InputError, match="3 blocks of 300: 900 tokens"):
        simulate(w, Policy(kv_capacity_tokens=1000, kv_block_size=300), MODEL, NO_NOISE, seed=0)


def test_block_size_validation():
    assert Policy(kv_capacity_tokens=2048, kv_block_size=128).kv_blocks == 16
    assert Policy().kv_block_size == 1 and Policy().to_dict()["kv_block_size"] == 1
    with pytest.raises(ValueError, match="kv_block_size"):
        Policy(kv_capacity_tokens=100, kv_block_size=128)
    with pytest.raises(ValueError, match="kv_block_size"):
        Policy(kv_block_size=0)


def test_full_prompt_admission_avoids_self_preemption():
    # 5 blocks of 4 tokens, budget 8. A (8 tokens, 2 blocks) decodes from step 1 with 3 blocks (4 at step 5).
    # First-chunk admission lets B (12 tokens) in at step 1 with a 7-token chunk (2 blocks); its next chunk needs
    # a 6th block, so B (the newest) preempts itself at step 2, is re-admitted at step 3, preempted again at
    # step 4, and prefills for good once A is done (steps 6-7): 14 prefill tokens wasted. Whole-prompt admission
    # waits until B's 3 blocks are free: the same first token, no preemption, no waste.
    w = Workload(np.zeros(2), np.array([8, 12]), np.array([6, 2]))
    runs = {}
    for full in (False, True):
        pol = Policy(
            max_num_seqs=4, max_num_batched_tokens=8, kv_capacity_tokens=20, kv_block_size=4, admit_full_prompt=full
        )
        runs[full] = simulate(w, pol, MODEL, NO_NOISE, seed=0)
    chunk, whole = runs[False], runs[True]
    assert chunk.iterations["prefill_tokens"].tolist() == [8, 7, 0, 7, 0, 0, 8, 4, 0]
    assert chunk.iterations["preempted_reqs"].tolist() == [0, 0, 1, 0, 1, 0, 0, 0, 0]
    assert chunk.requests["preemptions"].tolist() == [0, 2]
    assert whole.iterations["prefill_tokens"].tolist() == [8, 0, 0, 0, 0, 0, 8, 4, 0]
    assert whole.iterations["preempted_reqs"].sum() == 0
    assert whole.iterations["kv_usage"].tolist() == [0.4, 0.6, 0.6, 0.6, 0.6, 0.8, 0.4, 0.6, 0.8]
    assert chunk.requests["t_scheduled"][1] == chunk.iterations["t_start"][1]
    assert whole.requests["t_scheduled"][1] == whole.iterations["t_start"][6]
    for r in (chunk, whole):
        assert r.requests["t_first_token"][1] == r.iterations["t_end"][7]
