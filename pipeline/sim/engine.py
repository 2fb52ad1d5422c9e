"""A continuous-batching LLM server simulator (vLLM-v1-like scheduler).

The simulator is a pure function: :func:`simulate` takes a workload, a
scheduling policy, an iteration-time model and noise settings, and returns
numpy arrays (:class:`SimResult`). Fixture generation and trace replay both use it.

Mechanics, one engine step (iteration) ``k`` at a time:

1. If nothing is running and no arrived request waits, the clock jumps to the
   next arrival. Requests with ``t_arrival <= clock`` join the waiting queue.
2. **Decodes first**: every running request past its prefill gets exactly one
   token this step. Each decode needs one more KV slot.
3. **KV check**: KV is allocated in blocks of ``kv_block_size`` tokens (1:
   token-granular); the cache holds ``kv_capacity_tokens // kv_block_size``
   blocks and a request holds ``ceil(tokens in KV / kv_block_size)`` of them, so
   a decode needs a new block only when it crosses a block boundary (as vLLM's
   paged KV cache). If the blocks in use after the step would exceed the cache,
   the most recently admitted running request is
   preempted (recompute: its KV is freed, it goes to the FRONT of the waiting
   queue, and when re-admitted it re-prefills prompt + generated tokens). This
   repeats until the step fits; a request counts its preemptions, a step counts
   ``preempted_reqs``.
4. **Prefill, FCFS**: the budget left (``max_num_batched_tokens`` minus the
   decodes) goes to partially prefilled running requests in admission order,
   one chunk each (a chunk that does not fit in KV preempts newer requests, as
   in 3), then to waiting requests in queue order while
   ``running < max_num_seqs``, the budget lasts and KV has room (an admission
   never preempts; in a step that preempted, nothing is admitted, as in vLLM
   v1). An admission needs free blocks for its first chunk (after its cached
   prefix, with prefix caching), or for its whole prompt with
   ``admit_full_prompt``, and takes those of the chunk. With
   chunked prefill the last admitted prompt may be cut to the budget and
   continues next step. Without it a prompt must fit whole in the budget left;
   a prompt longer than the whole budget is admitted only as the first prefill
   of a step, and that step then exceeds the budget.
5. The step lasts ``model.base_ms(context, prefill, decode, requests, prefill_attn) * noise + stall``
   (requests: decodes + prefill chunks; prefill_attn: sum over chunks of ``chunk x (context
   before it + chunk / 2)``, the token pairs its attention computes; both cost 0 by default).
   ``context_tokens`` is the sum over scheduled sequences of their context
   before the step: prompt + generated tokens for a decode, prompt tokens
   already computed for a prefill chunk. ``kv_usage`` is the KV blocks held
   after the step (decodes: their context; prefills: computed + chunk, each
   rounded up to whole blocks) over the blocks of the cache.
6. A request whose last prompt chunk is computed in step ``k`` emits its first
   token at ``t_end[k]``, then one token per step; it finishes at the step that
   emits its ``output_tokens``-th token (the prefill step itself when
   ``output_tokens == 1``). Its KV is freed after that step.

Bookkeeping is aggregate, so the cost per step does not grow with the batch:
decoding requests live in a heap keyed by the step at which they finish, and
their total context at step ``k`` is ``B + n_decode * k`` (each decode adds one
token per step). A decode whose context is ``base + k`` takes a new block at the
steps ``k`` with ``(base + k - 1) % kv_block_size == 0``, so decodes are counted
per phase ``(1 - base) % kv_block_size`` and their blocks grow by the count of
phase ``k % kv_block_size`` at step ``k``. A request's token times are ``t_end``
over a contiguous range of steps per uninterrupted segment, so only segments
``(req, first, last)`` are stored; :func:`token_times` rebuilds the times by
slicing.

Prefix caching (``policy.prefix_caching``): at each admission a request gets ``c``
cached prompt tokens, prefills only ``L - c`` of its ``L`` tokens (prompt plus any
tokens generated before a preemption) with the cached ``c`` as its chunk's context,
and still holds KV blocks for all ``L`` (shared blocks are not deduplicated between
running requests). ``c`` is capped at ``L - 1``: the last prompt token is always
computed, as in vLLM, to produce the first token's logits. Where ``c`` comes from:

- the workload's block hashes (Mooncake ``hash_ids``, ``hash_block_tokens`` tokens
  each): a prefix cache of ``kv_capacity_tokens // hash_block_tokens`` blocks with
  LRU eviction. A request's blocks enter it when its prompt's prefill completes; at
  admission its hits are the longest run of its leading blocks that are resident
  (a block's KV depends on the whole prefix, so nothing after the first miss is
  reused), and ``c = hits x hash_block_tokens`` (at most the prompt). Blocks are
  touched last block first, so a prefix outlives its continuations in the LRU;
- else the workload's recorded ``cached_tokens`` (what the engine reported).

The request's ``cached_tokens`` is ``c`` at its first admission (as vLLM's
``num_cached_tokens``); ``info["prefix_cache"]`` counts blocks looked up and hit.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from pipeline.errors import InputError
from pipeline.sim.config import Policy
from pipeline.sim.model import IterationModel, NoiseModel
from pipeline.sim.prefix import PrefixCache
from pipeline.sim.workload import Workload

# what a canonical trace's iteration records carry (pipeline.sim.writer writes these)
TRACE_ITERATION_FIELDS = (
    "iter",
    "t_start",
    "t_end",
    "prefill_tokens",
    "prefill_reqs",
    "decode_tokens",
    "decode_reqs",
    "context_tokens",
    "running_reqs",
    "waiting_reqs",
    "kv_usage",
    "preempted_reqs",
)
# and the simulator's own per-step truth besides
ITERATION_FIELDS = TRACE_ITERATION_FIELDS + (
    "stall_ms",
    "base_ms",
    "prefill_attn",
)
REQUEST_FIELDS = (
    "req_id",
    "t_arrival",
    "t_scheduled",
    "t_first_token",
    "t_finish",
    "prompt_tokens",
    "output_tokens",
    "preemptions",
    "status",
    "cached_tokens",
)
NOISE_CHUNK = 16384  # noise is drawn this many iterations at a time; progress is reported as often


@dataclass
class SimResult:
    """What a simulation produced; all values are numpy arrays.

    Attributes:
        iterations: one entry per step, keys :data:`ITERATION_FIELDS`; times in
            seconds except ``stall_ms`` (injected stall, 0 if none) and
            ``base_ms`` (model time before noise and stall).
        requests: one entry per request that arrived before the run stopped,
            keys :data:`REQUEST_FIELDS`; times NaN where not reached; status
            ``ok`` (finished) or ``aborted`` (still queued or running at the stop).
        token_segments: ``req`` (row in ``requests``), ``first``, ``last``: the
            request emitted one token at ``t_end`` of every step in ``first..last``.
        prefill_chunks: one entry per prefill chunk: ``req`` (row in
            ``requests``), ``iter``, ``tokens`` and ``computed_before`` (prompt
            tokens already in KV, the chunk's context). The iterations that
            computed a request's prompt, for tail attribution.
        info: seed, stop reason and counts.
    """

    iterations: dict[str, np.ndarray]
    requests: dict[str, np.ndarray]
    token_segments: dict[str, np.ndarray]
    prefill_chunks: dict[str, np.ndarray] = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    _flat: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    @property
    def n_iterations(self) -> int:
        """Number of steps simulated."""
        return len(self.iterations["t_end"])

    @property
    def n_requests(self) -> int:
        """Number of requests in the result."""
        return len(self.requests["t_arrival"])

    def token_times_flat(self) -> tuple[np.ndarray, np.ndarray]:
        """All token times as ``(offsets, values)``: request r owns ``values[offsets[r]:offsets[r+1]]``."""
        if self._flat is None:
            self._flat = _flatten_token_times(self)
        return self._flat


def _flatten_token_times(result: SimResult) -> tuple[np.ndarray, np.ndarray]:
    seg = result.token_segments
    req, first, last = seg["req"], seg["first"], seg["last"]
    order = np.lexsort((first, req))
    req, first, last = req[order], first[order], last[order]
    lens = last - first + 1
    starts = np.cumsum(lens) - lens
    # flat position p of segment s maps to step first[s] + (p - starts[s])
    steps = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(starts - first, lens)
    values = result.iterations["t_end"][steps]
    counts = np.bincount(req, weights=lens, minlength=result.n_requests).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    return offsets, values


def token_times(result: SimResult, req_index_or_all=None):
    """Absolute output-token times (s) of one request (by row index) or of all.

    Returns a numpy array for an integer index, or a list of arrays (one per
    request row) for ``None``/``"all"``. Built by slicing ``t_end``, not by
    looping over tokens.
    """
    offsets, values = result.token_times_flat()
    if req_index_or_all is None or (isinstance(req_index_or_all, str) and req_index_or_all == "all"):
        return np.split(values, offsets[1:-1]) if result.n_requests else []
    r = int(req_index_or_all)
    return values[offsets[r] : offsets[r + 1]]


def check_fits(workload: Workload, policy: Policy) -> None:
    """Refuse a policy whose KV cache cannot hold the largest request of ``workload``."""
    if len(workload) == 0:
        return
    need = workload.prompt_tokens + workload.output_tokens - 1
    worst = int(np.argmax(need))
    if need[worst] > policy.kv_usable_tokens:
        blocks = (
            f" ({policy.kv_blocks} blocks of {policy.kv_block_size}: {policy.kv_usable_tokens} tokens)"
            if policy.kv_block_size > 1
            else ""
        )
        raise InputError(
            f"request {str(workload.ids()[worst])!r}{workload.where(worst)} needs {int(need[worst])} KV tokens "
            "(prompt + output - 1) but "
            f"kv_capacity_tokens is {policy.kv_capacity_tokens}{blocks}. Raise --kv-capacity-tokens or shorten "
            "the request."
        )


def simulate(
    workload: Workload,
    policy: Policy,
    model: IterationModel,
    noise: NoiseModel,
    seed: int,
    t_end_s: float | None = None,
    progress: Callable[[int], None] | None = None,
    max_iterations: int | None = None,
) -> SimResult:
    """Run the scheduler over ``workload`` and return per-step and per-request arrays.

    Args:
        workload: requests sorted by arrival.
        policy: scheduler settings.
        model: iteration-time model.
        noise: noise and stall settings (drawn from ``numpy.random.default_rng(seed)``).
        seed: makes the run reproducible.
        t_end_s: do not start a step at or after this simulated time.
        progress: called with the number of steps done so far, every
            :data:`NOISE_CHUNK` steps and at the end.
        max_iterations: stop after this many steps.

    The run ends when every request finished, or at ``t_end_s`` / ``max_iterations``.
    """
    check_fits(workload, policy)
    rng = np.random.default_rng(seed)
    n = len(workload)
    t_arr = workload.t_arrival.tolist()
    P = workload.prompt_tokens.tolist()
    O = workload.output_tokens.tolist()
    M = policy.max_num_batched_tokens
    S = policy.max_num_seqs
    bs = policy.kv_block_size
    capb = policy.kv_blocks
    chunked = policy.chunked_prefill
    full = policy.admit_full_prompt
    t0, ca, cb, cc = model.t0_ms, model.a_ms_per_ctx, model.b_ms_per_prefill, model.c_ms_per_decode
    cd, ce = model.d_ms_per_req, model.e_ms_per_prefill_attn
    k_max = math.inf if max_iterations is None else max_iterations
    pcache = PrefixCache.for_run(workload, policy)
    t_stop = math.inf if t_end_s is None else t_end_s

    nan = math.nan
    gen = [0] * n  # tokens generated; while decoding: as of the step in seg_start
    seg_start = [0] * n  # step of the current token segment's first token
    dec_base = [0] * n  # contribution to B while decoding
    seq_of = [-1] * n  # admission number while running, -1 otherwise
    partial_of = {}  # running requests mid-prefill: req -> tokens computed
    t_sched = [nan] * n
    t_first = [nan] * n
    t_fin = [nan] * n
    npre = [0] * n
    cpre = [0] * n  # cached tokens at the latest admission
    c_first = [0] * n  # cached tokens at the first admission

    waiting: deque[int] = deque()
    partial: list[int] = []  # requests mid-prefill, in admission order
    dec_heap: list[tuple[int, int, int]] = []  # (finish step, admission number, req)
    run_heap: list[tuple[int, int]] = []  # (-admission number, req): newest first
    B = 0  # decode context at step k is B + n_d * k
    n_d = 0
    n_run = 0
    D = 0  # KV blocks of the decodes after the current step
    phase = [0] * bs  # decodes per phase (1 - dec_base) % bs: they take a new block at steps k % bs == phase
    kvb_partial = 0  # KV blocks held by requests mid-prefill
    seq = 0
    nxt = 0

    seg_req, seg_first, seg_last = array("q"), array("q"), array("q")
    ch_req, ch_iter, ch_tok, ch_ctx = array("q"), array("q"), array("q"), array("q")
    o_tstart, o_tend, o_base, o_stall, o_kv, o_attn = (array("d") for _ in range(6))
    o_pf, o_pfr, o_dec, o_ctx, o_run, o_wait, o_pre = (array("q") for _ in range(7))

    k = 0
    clock = 0.0
    redraw_at = 0
    next_check = 0
    j0 = 0
    fac: list[float] = []
    stl: list[float] = []
    stop = "done"
    while True:
        if k == next_check:
            if k >= k_max:
                stop = "max_iterations"
                break
            if k == redraw_at:  # chunk boundaries do not depend on max_iterations
                if progress is not None and k:
                    progress(k)
                f_arr, s_arr = noise.draw(rng, NOISE_CHUNK)
                fac, stl = f_arr.tolist(), s_arr.tolist()
                redraw_at = k + NOISE_CHUNK
                j0 = k
            next_check = min(redraw_at, k_max)
        if n_run == 0 and not waiting:
            if nxt >= n:
                break
            if t_arr[nxt] > clock:
                clock = t_arr[nxt]
        if clock >= t_stop:
            stop = "t_end_s"
            break
        while nxt < n and t_arr[nxt] <= clock:
            waiting.append(nxt)
            nxt += 1
        D += phase[k % bs]  # decodes that cross a block boundary this step

        # running requests: decodes, then partial prefills in admission order
        preempted = 0
        pf = 0  # prefill tokens scheduled
        pfb = 0  # KV blocks the scheduled prefill chunks add
        pf_ctx = 0  # context of prefill chunks
        pf_attn = 0.0  # attention pairs of prefill chunks: sum of chunk * (context before it + chunk / 2)
        sched: list[tuple[int, int]] = []  # (req, chunk) for prefill chunks
        pi = 0
        while True:
            if pi < len(partial):
                r = partial[pi]
                c0 = partial_of[r]
                rem = P[r] + gen[r] - c0
                budget = M - n_d - pf
                chunk = rem if rem < budget else budget
                extra = (c0 + chunk + bs - 1) // bs - (c0 + bs - 1) // bs
            else:
                r = -1
                chunk = extra = 0
            if D + kvb_partial + pfb + extra <= capb:
                if chunk <= 0:
                    break
                sched.append((r, chunk))
                pf_ctx += c0
                pf_attn += chunk * (c0 + chunk / 2)
                pf += chunk
                pfb += extra
                pi += 1
                continue
            # preempt the most recently admitted running request
            while True:
                s_neg, v = heapq.heappop(run_heap)
                if seq_of[v] == -s_neg:
                    break
            seq_of[v] = -1
            n_run -= 1
            npre[v] += 1
            preempted += 1
            waiting.appendleft(v)
            if v in partial_of:
                kvb_partial -= (partial_of.pop(v) + bs - 1) // bs
                partial.remove(v)  # the newest partial: never one already scheduled
            else:
                B -= dec_base[v]
                n_d -= 1
                D -= (dec_base[v] + k + bs - 1) // bs
                phase[(1 - dec_base[v]) % bs] -= 1
                done = gen[v] + (k - 1 - seg_start[v])
                seg_req.append(v)
                seg_first.append(seg_start[v])
                seg_last.append(k - 1)
                gen[v] = done

        # admissions (vLLM v1 admits nothing in a step that preempted)
        admitted = -1  # a newly admitted request left mid-prefill
        if not preempted:
            while waiting and n_run < S:
                r = waiting[0]
                L = P[r] + gen[r]
                c = 0 if pcache is None else pcache.cached(r, P[r], L)
                need = L - c
                budget = M - n_d - pf
                if chunked:
                    if budget <= 0:
                        break
                    chunk = need if need <= budget else budget
                elif need <= budget or (need > M and not sched):
                    chunk = need
                else:
                    break
                blocks = (c + chunk + bs - 1) // bs
                if D + kvb_partial + pfb + ((L + bs - 1) // bs if full else blocks) > capb:
                    break
                waiting.popleft()
                if pcache is not None:
                    pcache.admit(r)
                cpre[r] = c
                seq += 1
                seq_of[r] = seq
                heapq.heappush(run_heap, (-seq, r))
                n_run += 1
                if t_sched[r] != t_sched[r]:
                    t_sched[r] = clock
                    c_first[r] = c
                sched.append((r, chunk))
                pf += chunk
                pf_ctx += c
                pf_attn += chunk * (c + chunk / 2)
                pfb += blocks
                if c + chunk < L:
                    admitted = r
                    break

        if not sched and n_d == 0:
            raise RuntimeError(f"scheduler made no progress at step {k} (bug)")

        # iteration time
        ctx = B + n_d * k + pf_ctx
        base = t0 + ca * ctx + cb * pf + cc * n_d
        if cd or ce:  # the extended terms (0 by default: such runs draw and time exactly as before)
            base += cd * (n_d + len(sched)) + ce * pf_attn
        j = k - j0
        st = stl[j]
        t_start = clock
        clock = t_start + (base * fac[j] + st) * 1e-3
        o_tstart.append(t_start)
        o_tend.append(clock)
        o_base.append(base)
        o_stall.append(st)
        o_pf.append(pf)
        o_attn.append(pf_attn)
        o_pfr.append(len(sched))
        o_dec.append(n_d)
        o_ctx.append(ctx)
        o_run.append(n_run)
        o_wait.append(len(waiting))
        o_kv.append((D + kvb_partial + pfb) / capb)
        o_pre.append(preempted)

        # decodes that emitted their last token this step
        while dec_heap and dec_heap[0][0] == k:
            _, s, r = heapq.heappop(dec_heap)
            if seq_of[r] != s:
                continue  # preempted since
            seq_of[r] = -1
            n_run -= 1
            B -= dec_base[r]
            n_d -= 1
            D -= (dec_base[r] + k + bs - 1) // bs
            phase[(1 - dec_base[r]) % bs] -= 1
            gen[r] = O[r]
            t_fin[r] = clock
            seg_req.append(r)
            seg_first.append(seg_start[r])
            seg_last.append(k)

        # prefill chunks: completed prompts emit a token and start decoding
        for r, chunk in sched:
            ch_req.append(r)
            ch_iter.append(k)
            ch_tok.append(chunk)
            if r in partial_of:
                c0 = partial_of[r]
                ch_ctx.append(c0)
                done = c0 + chunk
                if done < P[r] + gen[r]:
                    partial_of[r] = done
                    kvb_partial += (done + bs - 1) // bs - (c0 + bs - 1) // bs
                    continue
                kvb_partial -= (partial_of.pop(r) + bs - 1) // bs
                partial.remove(r)
            else:
                c0 = cpre[r]
                ch_ctx.append(c0)
                if r == admitted:
                    partial_of[r] = c0 + chunk
                    partial.append(r)
                    kvb_partial += (c0 + chunk + bs - 1) // bs
                    continue
            if pcache is not None and gen[r] == 0:
                pcache.computed(r)
            g = gen[r] + 1
            gen[r] = g
            seg_start[r] = k
            if t_first[r] != t_first[r]:
                t_first[r] = clock
            if g >= O[r]:
                seq_of[r] = -1
                n_run -= 1
                t_fin[r] = clock
                seg_req.append(r)
                seg_first.append(k)
                seg_last.append(k)
            else:
                d = P[r] + g - 1 - k
                dec_base[r] = d
                B += d
                n_d += 1
                D += (P[r] + g - 2 + bs) // bs  # its blocks as of this step: ceil((P + g - 1) / bs)
                phase[(1 - d) % bs] += 1
                heapq.heappush(dec_heap, (k + O[r] - g, seq_of[r], r))

        if len(run_heap) > 4 * n_run + 4096:  # drop entries of requests no longer running
            run_heap = [(s, r) for s, r in run_heap if seq_of[r] == -s]
            heapq.heapify(run_heap)
        k += 1

    # close the token segments of requests still decoding at the stop
    for _, s, r in dec_heap:
        if seq_of[r] == s:
            seg_req.append(r)
            seg_first.append(seg_start[r])
            seg_last.append(k - 1)
    if progress is not None:
        progress(k)

    n_seen = nxt
    t_end_arr = np.frombuffer(o_tend, dtype=np.float64) if k else np.zeros(0)
    dec = np.frombuffer(o_dec, dtype=np.int64) if k else np.zeros(0, np.int64)
    iterations = {
        "iter": np.arange(k, dtype=np.int64),
        "t_start": _np(o_tstart, np.float64),
        "t_end": t_end_arr,
        "prefill_tokens": _np(o_pf, np.int64),
        "prefill_reqs": _np(o_pfr, np.int64),
        "decode_tokens": dec,
        "decode_reqs": dec.copy(),
        "context_tokens": _np(o_ctx, np.int64),
        "running_reqs": _np(o_run, np.int64),
        "waiting_reqs": _np(o_wait, np.int64),
        "kv_usage": _np(o_kv, np.float64),
        "preempted_reqs": _np(o_pre, np.int64),
        "stall_ms": _np(o_stall, np.float64),
        "base_ms": _np(o_base, np.float64),
        "prefill_attn": _np(o_attn, np.float64),
    }
    t_fin_arr = np.array(t_fin[:n_seen], dtype=np.float64)
    requests = {
        "req_id": workload.ids()[:n_seen],
        "t_arrival": workload.t_arrival[:n_seen].copy(),
        "t_scheduled": np.array(t_sched[:n_seen], dtype=np.float64),
        "t_first_token": np.array(t_first[:n_seen], dtype=np.float64),
        "t_finish": t_fin_arr,
        "prompt_tokens": workload.prompt_tokens[:n_seen].copy(),
        "output_tokens": workload.output_tokens[:n_seen].copy(),
        "preemptions": np.array(npre[:n_seen], dtype=np.int64),
        "status": np.where(np.isnan(t_fin_arr), "aborted", "ok"),
        "cached_tokens": np.array(c_first[:n_seen], dtype=np.int64),
    }
    segments = {"req": _np(seg_req, np.int64), "first": _np(seg_first, np.int64), "last": _np(seg_last, np.int64)}
    chunks = {
        "req": _np(ch_req, np.int64),
        "iter": _np(ch_iter, np.int64),
        "tokens": _np(ch_tok, np.int64),
        "computed_before": _np(ch_ctx, np.int64),
    }
    info = {"seed": seed, "stop": stop, "iterations": k, "requests_arrived": n_seen, "requests_total": n}
    if pcache is not None:
        info["prefix_cache"] = pcache.info()
    return SimResult(iterations, requests, segments, chunks, info)


def _np(buf: array, dtype) -> np.ndarray:
    """Copy an ``array.array`` into a numpy array (zero-length safe)."""
    return np.frombuffer(buf, dtype=dtype).copy() if len(buf) else np.zeros(0, dtype=dtype)
