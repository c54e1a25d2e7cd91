"""Free-page bookkeeping for the KV pool."""

from __future__ import annotations


class PageAllocator:
    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self._free: list[int] = list(range(num_pages - 1, -1, -1))  # pop() hands out low ids first
        self._is_free = bytearray([1]) * num_pages  # alloc and free keep it equal to the free list's members

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self._is_free[p] = 0
        return pages

    def free(self, pages: list[int]) -> None:
        for p in pages:
            if self._is_free[p]:
                raise RuntimeError(f"KV page {p} freed twice")
            self._is_free[p] = 1
            self._free.append(p)

    def is_free(self, page: int) -> bool:
        return bool(self._is_free[page])

    def check(self) -> None:
        """The free list holds each flagged page once: flags are set only by free() (which refuses a page already
        free) as it appends, and cleared by alloc() as it pops, so equal counts mean equal sets. C-speed count:
        the engine runs this after every step in tests, on pools of up to a million pages."""
        assert self._is_free.count(1) == len(self._free), "free list and free flags out of sync"
