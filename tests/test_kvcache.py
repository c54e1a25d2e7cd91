"""Radix tree, allocator and cache manager: exact page accounting."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kvcache.allocator import PageAllocator
from kvcache.manager import SPARE_PAGES, CacheManager
from kvcache.radix import RadixCache


@dataclass(eq=False)
class FakeReq:  # the manager's CacheUser protocol, nothing more
    ids: list[int]
    pages: list[int] = field(default_factory=list)
    cached_len: int = 0
    device_len: int = 0
    prefix_node: object = None

    @property
    def all_ids(self):
        return self.ids

    @property
    def num_tokens(self):
        return len(self.ids)


def test_allocator_rejects_double_free_and_overdraw():
    a = PageAllocator(4)
    pages = a.alloc(3)
    assert a.alloc(2) is None and a.num_free == 1
    a.free(pages)
    with pytest.raises(RuntimeError, match="freed twice"):
        a.free(pages[:1])


def test_radix_match_insert_split_and_lru_evict():
    r = RadixCache(page_size=2)
    assert r.insert([1, 2, 3, 4, 5, 6], [10, 11, 12]) == 0
    assert r.insert([1, 2, 3, 4, 7, 8], [20, 21, 22]) == 4  # shares two pages, splits the first node
    node, pages = r.match([1, 2, 3, 4, 7, 8, 9])
    assert pages == [10, 11, 22]
    node2, pages2 = r.match([1, 2, 9, 9])
    assert pages2 == [10]
    assert r.evictable_pages == 4
    r.lock(node)
    assert r.evictable_pages == 1 and r.locked_pages == 3
    assert r.evict(5) == [12]  # only the unlocked leaf can go
    r.unlock(node)
    assert sorted(r.evict(10)) == [10, 11, 22]  # leaves first, then the parent that became a leaf
    assert r.evictable_pages == 0 and r.match([1, 2])[1] == []


def test_radix_partial_page_is_never_matched():
    r = RadixCache(page_size=4)
    r.insert([1, 2, 3, 4], [0])
    assert r.match([1, 2, 3])[1] == []
    assert r.match([1, 2, 3, 4, 5])[1] == [0]


def test_pages_come_in_runs_while_the_pool_has_room():
    """With its longest length known, a request takes RUN_PAGES consecutive ids at a time (the prompt's pages then
    its first decode run in one piece), never past that length, and none ahead once the pool runs short; the
    accounting holds throughout and release gives every page back."""
    m = CacheManager(num_pages=1024, page_size=4)
    a, b = FakeReq(list(range(10))), FakeReq(list(range(100, 110)))
    assert m.admit(a, up_to=10 + 40) and m.admit(b, up_to=10 + 40)
    assert a.pages == list(range(0, 10)) and b.pages == list(range(10, 20))  # 3 for the prompt + a run of 7
    for n in range(11, 51):  # decode both, interleaved as the scheduler does
        for r in (a, b):
            assert m.grow(r, n, up_to=50)
            r.device_len = n
        m.check([a, b])
    assert a.pages == list(range(0, 10)) + [20, 21, 22] and b.pages == list(range(10, 20)) + [23, 24, 25]
    assert len(a.pages) == m.pages_for(50)  # the last run cut at the request's longest length
    # Short of room (no more than SPARE_PAGES free after a run): one page at a time.
    n = m.num_free - 7 - (SPARE_PAGES + 4)
    c = FakeReq(list(range(2000, 2000 + 4 * n)))
    assert m.admit(c, up_to=4 * n + 40) and len(c.pages) == n + 7 and m.num_free == SPARE_PAGES + 4
    d = FakeReq(list(range(300, 304)))
    assert m.admit(d, up_to=400) and len(d.pages) == 1 and m.num_free == SPARE_PAGES + 3
    for r in (a, b, c, d):
        m.release(r)
    m.check([])
    assert m.num_free + m.num_evictable == 1024 and m.num_in_use == 0


def test_manager_accounting_through_admit_grow_release():
    m = CacheManager(num_pages=8, page_size=4)
    a = FakeReq(list(range(10)))
    assert m.admit(a)
    assert len(a.pages) == 3 and m.num_in_use == 3
    a.device_len = 10
    m.check([a])
    assert m.grow(a, 13) and len(a.pages) == 4
    a.device_len = 13
    m.check([a])
    # A twin with the same prefix shares the cached pages once `a` is released.
    a_pages = list(a.pages)
    m.release(a)
    m.check([])
    # KV is cached only for known tokens (10), in whole pages (8); the rest is freed.
    assert m.num_in_use == 0 and m.num_evictable == 2 and m.num_free == 6
    b = FakeReq(list(range(10)) + [99, 98])
    assert m.admit(b)
    assert b.cached_len == 8 and b.pages[:2] == a_pages[:2]
    m.check([b])
    # Running out: a request needing more than free + evictable is refused and holds nothing.
    c = FakeReq(list(range(100, 140)))
    assert not m.admit(c)
    m.check([b])
    m.release(b)
    m.check([])
    assert m.num_free + m.num_evictable == 8


def test_manager_frees_duplicate_pages_of_a_twin():
    m = CacheManager(num_pages=10, page_size=2)
    x, y = FakeReq([1, 2, 3, 4, 5]), FakeReq([1, 2, 3, 4, 6])
    assert m.admit(x) and m.admit(y)  # both miss: nothing cached yet
    x.device_len = y.device_len = 5
    m.release(x)
    m.release(y)  # y's first two pages duplicate x's: freed, not leaked
    m.check([])
    assert m.num_evictable == 2 and m.num_free == 8


def test_evict_all_frees_unused_cached_pages_but_not_held_ones():
    m = CacheManager(num_pages=10, page_size=2)
    x = FakeReq([1, 2, 3, 4, 5])
    assert m.admit(x)
    x.device_len = 5
    m.release(x)
    held = FakeReq([1, 2, 3, 4, 9])
    assert m.admit(held) and held.cached_len == 4  # locks the cached prefix
    other = FakeReq([7, 7, 7, 7, 7])
    assert m.admit(other)
    other.device_len = 5
    m.release(other)
    assert m.num_evictable == 2  # other's two pages; held's prefix is locked
    assert m.evict_all() == 2
    m.check([held])
    assert m.num_evictable == 0 and m.num_free == 10 - len(held.pages)
    assert m.radix is not None and m.radix.match([1, 2, 3, 4, 9])[1] == held.pages[:2]  # held prefix kept


@pytest.mark.parametrize("corrupt", ["lost", "shared", "free and held"])
def test_check_catches_every_kind_of_broken_accounting(corrupt):
    """check() looks at the pages in use only; each way a page can go astray must still fail it."""
    m = CacheManager(num_pages=8, page_size=4)
    a, b = FakeReq(list(range(6))), FakeReq(list(range(50, 56)))
    assert m.admit(a) and m.admit(b)
    m.check([a, b])
    if corrupt == "lost":  # a request's page vanished: neither free nor held by anyone
        a.pages.pop()
    elif corrupt == "shared":  # two requests hold the same private page
        b.pages[0] = a.pages[0]
    else:  # freed behind its holder's back
        m.allocator.free(a.pages[-1:])
    with pytest.raises(AssertionError, match="page accounting broken|both free and in use"):
        m.check([a, b])
