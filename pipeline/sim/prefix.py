"""The simulator's prefix cache: where an admitted request's cached prompt tokens come from.

The rule is stated in :mod:`pipeline.sim.engine` ("Prefix caching"): recorded
``cached_tokens``, or an LRU over the workload's block hashes (Mooncake ``hash_ids``)
sized by the KV capacity. The engine asks :meth:`PrefixCache.cached` while a request
waits, calls :meth:`PrefixCache.admit` when it is admitted and
:meth:`PrefixCache.computed` when its prompt's prefill completes. Per-block Python
work happens only at admissions and prefill completions (the event loop's exception).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.sim.engine import Policy
    from pipeline.sim.workload import Workload


class PrefixCache:
    """Cached prompt tokens per admission, from recorded counts or an LRU over block hashes."""

    def __init__(self, workload: Workload, policy: Policy) -> None:
        self.hashed = workload.has_hashes
        self.block = workload.hash_block_tokens
        if self.hashed:
            self.off = workload.hash_offsets.tolist()
            self.vals = workload.hash_values.tolist()
            self.capacity = max(policy.kv_capacity_tokens // self.block, 1)
            self.lru: OrderedDict[int, None] = OrderedDict()
        else:
            self.recorded = workload.cached_tokens.tolist()
        self.version = 0  # bumped when the resident set changes: a waiting request's hits are memoised
        self.memo = (-1, -1, 0)  # (req, version, hit blocks)
        self.looked_up = self.hit = 0

    @classmethod
    def for_run(cls, workload: Workload, policy: Policy) -> "PrefixCache | None":
        if not policy.prefix_caching or (not workload.has_hashes and workload.cached_tokens is None):
            return None
        return cls(workload, policy)

    def _hits(self, r: int) -> int:
        req, ver, h = self.memo
        if req == r and ver == self.version:
            return h
        h = 0
        lru = self.lru
        for key in self.vals[self.off[r] : self.off[r + 1]]:
            if key not in lru:
                break
            h += 1
        self.memo = (r, self.version, h)
        return h

    def cached(self, r: int, prompt: int, L: int) -> int:
        """Cached tokens if ``r`` (``L`` tokens to prefill, ``prompt`` of them its prompt) were admitted now."""
        c = min(self._hits(r) * self.block if self.hashed else self.recorded[r], prompt)
        return c if c < L else L - 1

    def admit(self, r: int) -> None:
        """``r`` was admitted: its hit blocks become most recently used (last block first)."""
        if not self.hashed:
            return
        h = self._hits(r)
        lo = self.off[r]
        self.looked_up += self.off[r + 1] - lo
        self.hit += h
        lru = self.lru
        for i in range(lo + h - 1, lo - 1, -1):
            lru.move_to_end(self.vals[i])

    def computed(self, r: int) -> None:
        """``r``'s prompt was prefilled: its blocks are resident, the LRU ones evicted beyond capacity."""
        if not self.hashed:
            return
        lru = self.lru
        changed = False
        for i in range(self.off[r + 1] - 1, self.off[r] - 1, -1):
            key = self.vals[i]
            if key in lru:
                lru.move_to_end(key)
            else:
                lru[key] = None
                changed = True
        while len(lru) > self.capacity:
            lru.popitem(last=False)
            changed = True
        if changed:
            self.version += 1

    def info(self) -> dict:
        if not self.hashed:
            return {"source": "recorded cached_tokens"}
        return {
            "source": "hash_ids",
            "block_tokens": self.block,
            "capacity_blocks": self.capacity,
            "blocks_looked_up": self.looked_up,
            "blocks_hit": self.hit,
            "resident_blocks": len(self.lru),
        }
