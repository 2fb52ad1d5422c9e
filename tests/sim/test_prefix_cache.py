"""Prefix caching in the simulator: hits from block hashes, recorded cached tokens, the TTFT they save."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.sim import NO_NOISE, IterationModel, Policy, Workload, simulate

BT = 512  # tokens per block hash, as in Mooncake traces


def shared_prefix_workload(n: int, seed: int, gap_s: float, roots: int = 5, root_blocks: int = 4) -> Workload:
    """Requests that start with part of one of a few shared "system prompts", then blocks of their own.

    The last block of every prompt is partial (as in Mooncake, ids = ceil(prompt / 512)).
    """
    rng = np.random.default_rng(seed)
    lists, prompts, nxt = [], [], 10_000
    for _ in range(n):
        root = int(rng.integers(roots))
        depth = int(rng.integers(1, root_blocks + 1))
        own = int(rng.integers(1, 4))
        ids = [root * 100 + j for j in range(depth)] + list(range(nxt, nxt + own))
        nxt += own
        lists.append(ids)
        prompts.append(len(ids) * BT - int(rng.integers(0, BT)))
    off = np.concatenate([[0], np.cumsum([len(x) for x in lists])])
    t = np.arange(n) * gap_s
    out = rng.integers(2, 40, n)
    return Workload(t, np.array(prompts), out, None, None, off, np.concatenate(lists), BT)


def set_based_hits(w: Workload, t_sched: np.ndarray, t_prefilled: np.ndarray) -> np.ndarray:
    """Hit blocks of each request: its leading blocks found among the blocks of every request whose
    prompt was prefilled by the time it was scheduled (an unbounded cache, no LRU)."""
    lists = [w.hash_values[w.hash_offsets[i] : w.hash_offsets[i + 1]].tolist() for i in range(len(w))]
    hits = np.zeros(len(w), dtype=np.int64)
    for i in range(len(w)):
        seen = set()
        for j in np.flatnonzero(t_prefilled <= t_sched[i]):
            if j != i:
                seen.update(lists[j])
        h = 0
        while h < len(lists[i]) and lists[i][h] in seen:
            h += 1
        hits[i] = h
    return hits


MODEL = IterationModel(t0_ms=5.0, a_ms_per_ctx=0.0002, b_ms_per_prefill=0.02)


@pytest.mark.parametrize("gap_s", [0.02, 2.0])  # busy (requests overlap) and isolated
def test_hits_from_hash_ids_equal_a_set_based_count(gap_s):
    w = shared_prefix_workload(300, seed=1, gap_s=gap_s)
    policy = Policy(max_num_seqs=32, max_num_batched_tokens=4096, kv_capacity_tokens=10_000_000, prefix_caching=True)
    r = simulate(w, policy, MODEL, NO_NOISE, 0)
    rq = r.requests
    assert (rq["preemptions"] == 0).all()
    hits = set_based_hits(w, rq["t_scheduled"], rq["t_first_token"])
    expected = np.minimum(hits * BT, w.prompt_tokens - 1)
    assert hits.sum() > 100  # the workload does share prefixes
    np.testing.assert_array_equal(rq["cached_tokens"], expected)
    assert r.info["prefix_cache"]["blocks_hit"] == hits.sum()
    assert r.info["prefix_cache"]["blocks_looked_up"] == len(w.hash_values)
    # the steps computed only the uncached prompt tokens
    assert r.iterations["prefill_tokens"].sum() == (w.prompt_tokens - expected).sum()


def test_prefix_caching_off_recomputes_every_prompt():
    w = shared_prefix_workload(200, seed=2, gap_s=0.02)
    r = simulate(w, Policy(max_num_batched_tokens=4096, kv_capacity_tokens=10_000_000), MODEL, NO_NOISE, 0)
    assert (r.requests["cached_tokens"] == 0).all() and "prefix_cache" not in r.info
    assert r.iterations["prefill_tokens"].sum() == w.prompt_tokens.sum()


def test_ttft_falls_by_the_prefill_share_of_the_cached_tokens():
    # isolated requests, each prompt prefilled in one step, no noise: TTFT is one step,
    # t0 + a * context + b * computed; caching c tokens computes c fewer and reads c as context
    w = shared_prefix_workload(120, seed=3, gap_s=5.0)
    base = dict(max_num_seqs=32, max_num_batched_tokens=8192, kv_capacity_tokens=10_000_000)
    on = simulate(w, Policy(**base, prefix_caching=True), MODEL, NO_NOISE, 0).requests
    off = simulate(w, Policy(**base), MODEL, NO_NOISE, 0).requests
    ttft_on = on["t_first_token"] - on["t_arrival"]
    ttft_off = off["t_first_token"] - off["t_arrival"]
    hits = set_based_hits(w, on["t_scheduled"], on["t_first_token"])
    c = np.minimum(hits * BT, w.prompt_tokens - 1)
    saved_s = c * (MODEL.b_ms_per_prefill - MODEL.a_ms_per_ctx) / 1000
    assert (c > 0).sum() > 50
    np.testing.assert_allclose(ttft_off - ttft_on, saved_s, rtol=0, atol=1e-9)


def test_lru_evicts_a_prefix_that_other_blocks_pushed_out():
    # capacity of 4 blocks: A's 2 blocks, then 3 requests of 2 new blocks each push A out;
    # with room for 100 blocks A's prompt is found again (all but its last token cached)
    def run(capacity_blocks: int) -> np.ndarray:
        lists = [[1, 2], [3, 4], [5, 6], [7, 8], [1, 2]]
        off = np.concatenate([[0], np.cumsum([len(x) for x in lists])])
        w = Workload(np.arange(5) * 10.0, np.full(5, 2 * BT), np.full(5, 2), None, None, off, np.concatenate(lists), BT)
        policy = Policy(max_num_batched_tokens=4096, kv_capacity_tokens=capacity_blocks * BT, prefix_caching=True)
        return simulate(w, policy, MODEL, NO_NOISE, 0).requests["cached_tokens"]

    assert run(4).tolist() == [0, 0, 0, 0, 0]
    assert run(100).tolist() == [0, 0, 0, 0, 2 * BT - 1]


def test_lru_keeps_a_shared_prefix_longer_than_its_continuations():
    # capacity 3 blocks: [R, a], then [x, y] needs one block evicted. A request's blocks are touched
    # last block first, so R is more recent than a: a goes, and [R, a] later still finds R
    # (evicting in prompt order would drop R and leave a, which nothing can reach without R)
    lists = [[0, 1], [5, 6], [0, 1]]
    off = np.concatenate([[0], np.cumsum([len(x) for x in lists])])
    w = Workload(np.arange(3) * 10.0, np.full(3, 2 * BT), np.full(3, 2), None, None, off, np.concatenate(lists), BT)
    policy = Policy(max_num_batched_tokens=4096, kv_capacity_tokens=3 * BT, prefix_caching=True)
    r = simulate(w, policy, MODEL, NO_NOISE, 0)
    assert r.requests["cached_tokens"].tolist() == [0, 0, BT]


def test_recorded_cached_tokens_are_reused_and_capped_below_the_prompt():
    n = 50
    rng = np.random.default_rng(4)
    prompt = rng.integers(100, 3000, n)
    cached = np.minimum(rng.integers(0, 4000, n), prompt + 5)  # a few claim more than the prompt
    w = Workload(np.arange(n) * 5.0, prompt, np.full(n, 3), None, cached)
    r = simulate(w, Policy(max_num_batched_tokens=4096, prefix_caching=True), MODEL, NO_NOISE, 0)
    expected = np.minimum(cached, prompt - 1)
    np.testing.assert_array_equal(r.requests["cached_tokens"], expected)
    assert r.iterations["prefill_tokens"].sum() == (prompt - expected).sum()
    assert r.info["prefix_cache"]["source"] == "recorded cached_tokens"


def test_cached_prefix_counts_as_context_and_kv_of_a_chunked_prompt():
    # one request, 3000-token prompt with 2048 cached, chunks of 512: the chunks computed are
    # 512 + 440 tokens, the first with 2048 tokens of context; KV holds the whole prompt
    w = Workload(np.zeros(1), np.array([3000]), np.array([2]), None, np.array([2048]))
    policy = Policy(max_num_seqs=4, max_num_batched_tokens=512, kv_capacity_tokens=100_000, prefix_caching=True)
    r = simulate(w, policy, MODEL, NO_NOISE, 0)
    ch = r.prefill_chunks
    assert ch["tokens"].tolist() == [512, 3000 - 2048 - 512]
    assert ch["computed_before"].tolist() == [2048, 2048 + 512]
    assert r.iterations["context_tokens"][:2].tolist() == [2048, 2560]
    assert r.iterations["kv_usage"][1] * 100_000 == pytest.approx(3000)
