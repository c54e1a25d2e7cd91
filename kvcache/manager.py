"""Cache manager: the radix prefix cache and the page allocator behind one small API for the scheduler."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvcache.allocator import PageAllocator
from kvcache.radix import Node, RadixCache

# A request that takes new pages takes up to this many at once while the pool has room to spare (it needs the
# positions: never past its longest possible length). Its pages then run in consecutive ids, which the decode
# attention reads faster than pages handed out one by one across all running requests.
# Only while, after the run, more than an eighth of the pool and 512 pages are still free: pages taken ahead are
# nobody else's until the request ends, so a pool under pressure goes back to handing them out one by one.
RUN_PAGES = 8
SPARE_FRACTION, SPARE_PAGES = 8, 512


class CacheUser(Protocol):
    """What the manager needs of a request (engine.request.Req satisfies it)."""

    pages: list[int]
    cached_len: int
    device_len: int
    prefix_node: Node | None

    @property
    def all_ids(self) -> list[int]: ...

    @property
    def num_tokens(self) -> int: ...


class CacheManager:
    def __init__(self, num_pages: int, page_size: int, use_radix: bool = True):
        self.page_size = page_size
        self.num_pages = num_pages
        self.allocator = PageAllocator(num_pages)
        self.radix = RadixCache(page_size) if use_radix else None

    # ---- accounting -------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    @property
    def num_evictable(self) -> int:
        return self.radix.evictable_pages if self.radix else 0

    @property
    def num_available(self) -> int:
        return self.num_free + self.num_evictable

    @property
    def num_in_use(self) -> int:
        return self.num_pages - self.num_available

    def pages_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.page_size)

    # ---- allocation -------------------------------------------------------------------------------
    def _alloc(self, n: int) -> list[int] | None:
        if n > self.allocator.num_free and self.radix is not None:
            self.allocator.free(self.radix.evict(n - self.allocator.num_free))
        return self.allocator.alloc(n)

    def _ahead(self, need: int, have: int, up_to: int | None, keep: int = 0) -> int:
        """How many pages to take past the `need` new ones a request holding `have` asks for, so its pages run
        consecutively (RUN_PAGES): none without its longest possible length `up_to`, none past it, none unless
        the pool stays well stocked after them and `keep` more."""
        if up_to is None:
            return 0
        extra = min(RUN_PAGES - 1, self.pages_for(up_to) - have - need)
        spare = max(self.num_pages // SPARE_FRACTION, SPARE_PAGES)
        if extra <= 0 or self.allocator.num_free - need - extra - keep <= spare:
            return 0
        return extra

    def admit(self, req: CacheUser, headroom_pages: int = 0, use_cache: bool = True, up_to: int | None = None) -> bool:
        """Match the longest cached prefix, lock it, and allocate pages for the rest of the known tokens (and a run
        ahead for the first decode steps, up to `up_to` positions: see RUN_PAGES).
        Leaves `headroom_pages` available for running requests to grow; returns False (nothing held) if short.
        use_cache=False computes every token anew (a request that wants every prompt position's logits)."""
        tokens = req.all_ids
        node: Node | None = None
        pages: list[int] = []
        if self.radix is not None and use_cache:
            node, pages = self.radix.match(tokens[: len(tokens) - 1])  # at least one token must be computed
            self.radix.lock(node)
        need = self.pages_for(len(tokens)) - len(pages)
        need += self._ahead(need, len(pages), up_to, keep=headroom_pages)  # the first decode pages follow the prompt's
        if need + headroom_pages > self.num_available or (new := self._alloc(need)) is None:
            if node is not None and self.radix is not None:
                self.radix.unlock(node)
            return False
        req.prefix_node = node
        req.pages = pages + new
        req.cached_len = req.device_len = len(pages) * self.page_size
        return True

    def grow(self, req: CacheUser, n_tokens: int, up_to: int | None = None) -> bool:
        """Make sure pages cover positions [0, n_tokens); with `up_to`, the request's longest possible length,
        take a run of pages ahead while the pool has room (RUN_PAGES)."""
        need = self.pages_for(n_tokens) - len(req.pages)
        if need <= 0:
            return True
        new = self._alloc(need + self._ahead(need, len(req.pages), up_to))
        if new is None:
            return False
        req.pages += new
        return True

    def publish(self, req: CacheUser) -> None:
        """Put a running request's whole pages of computed (or in-flight: one GPU stream orders them) KV into the
        radix tree now, locked by it, so requests that arrive while it still runs (a conversation's next turn,
        agents sharing a prompt) reuse them instead of waiting for it to finish. Where the tree already had a page
        for the same tokens (a twin request published first), ours is freed and the tree's is used."""
        if self.radix is None:
            return
        ps = self.page_size
        n_pages = min(req.device_len, req.num_tokens) // ps
        own_from = req.cached_len // ps
        if n_pages <= own_from:
            return
        tokens = req.all_ids[: n_pages * ps]
        already = self.radix.insert(tokens, req.pages[:n_pages]) // ps
        node, tree_pages = self.radix.match(tokens)
        self.radix.lock(node)
        if req.prefix_node is not None:
            self.radix.unlock(req.prefix_node)  # an ancestor of node: it stays locked through node
        self.allocator.free([p for p, t in zip(req.pages[own_from:already], tree_pages[own_from:already]) if p != t])
        req.pages[:n_pages] = tree_pages
        req.prefix_node, req.cached_len = node, n_pages * ps

    def release(self, req: CacheUser) -> None:
        """Give back a request's pages: whole pages of computed KV go into the radix tree, the rest are freed."""
        self.publish(req)  # no-op without a radix cache (cached_len stays 0: everything is freed below)
        if self.radix is not None and req.prefix_node is not None:
            self.radix.unlock(req.prefix_node)
        self.allocator.free(req.pages[req.cached_len // self.page_size :])
        req.pages, req.prefix_node, req.cached_len, req.device_len = [], None, 0, 0

    def evict_all(self) -> int:
        """Drop every cached page no request holds (a benchmark's repeated run must not hit the last one's
        prefixes); returns how many pages were freed."""
        freed = self.radix.evict(self.num_evictable) if self.radix is not None else []
        self.allocator.free(sorted(freed, reverse=True))  # the free list pops its last: low ids first, in runs
        return len(freed)

    # ---- invariants (tests call this after every step) ------------------------------------------------
    def check(self, live: Sequence[CacheUser]) -> None:
        ps = self.page_size
        # Every page is exactly one of free / locked in the tree / evictable in the tree / private to a request.
        # Checked over the pages in use only (the free list checks itself), so it costs O(pages in use) per step.
        self.allocator.check()
        locked, evictable = self.radix.page_sets() if self.radix else ([], [])
        private = [p for r in live for p in r.pages[r.cached_len // ps :]]
        used = locked + evictable + private
        assert self.allocator.num_free + len(used) == self.num_pages and len(used) == len(set(used)), (
            f"page accounting broken: free {self.allocator.num_free} + locked {len(locked)} + evictable "
            f"{len(evictable)} + private {len(private)} != {self.num_pages} (or duplicates)"
        )
        assert not any(self.allocator.is_free(p) for p in used), "a page both free and in use"
        assert len(evictable) == self.num_evictable, "evictable page counter out of sync"
        assert self.radix is None or len(locked) == self.radix.locked_pages, "locked page counter out of sync"
        assert self.num_free + self.num_evictable + self.num_in_use == self.num_pages
        tree_pages = set(locked)
        for r in live:
            assert 0 <= r.cached_len <= r.device_len, (r.cached_len, r.device_len)
            assert len(r.pages) * ps >= r.device_len, "KV written past a request's pages"
            assert set(r.pages[: r.cached_len // ps]) <= tree_pages, "cached prefix pages not locked in the tree"
        if self.radix is not None:
            expected: dict[int, int] = {}
            for r in live:
                n = r.prefix_node
                while n is not None and n is not self.radix.root:
                    expected[id(n)] = expected.get(id(n), 0) + 1
                    n = n.parent
            for n in self.radix._nodes():
                assert n.lock == expected.get(id(n), 0), f"radix lock {n.lock} != live users {expected.get(id(n), 0)}"
