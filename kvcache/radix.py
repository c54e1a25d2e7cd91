"""Radix tree over token ids whose values are KV pages; locked paths are in use, unlocked leaves evict LRU.

Keys are cut in whole pages: a node's key length is a multiple of page_size and its value holds one page
id per page_size tokens, so a cached prefix always maps to whole pages.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field


@dataclass(eq=False, slots=True)
class Node:
    key: tuple[int, ...] = ()
    pages: list[int] = field(default_factory=list)
    parent: Node | None = None
    children: dict[tuple[int, ...], Node] = field(default_factory=dict)
    lock: int = 0
    last_used: int = 0


class RadixCache:
    def __init__(self, page_size: int):
        self.ps = page_size
        self.root = Node()
        self.root.lock = 1  # never evicted
        self._clock = itertools.count(1)
        self.evictable_pages = 0
        self.locked_pages = 0

    def _first(self, key: tuple[int, ...] | list[int]) -> tuple[int, ...]:
        return tuple(key[: self.ps])

    def _match_len(self, a: tuple[int, ...], b: list[int] | tuple[int, ...]) -> int:
        n = min(len(a), len(b)) // self.ps * self.ps
        i = 0
        while i < n and a[i : i + self.ps] == tuple(b[i : i + self.ps]):
            i += self.ps
        return i

    def _split(self, node: Node, at: int) -> Node:
        """Cut node's key at `at` tokens; returns the new upper node."""
        upper = Node(node.key[:at], node.pages[: at // self.ps], node.parent, {}, node.lock, node.last_used)
        assert node.parent is not None
        node.parent.children[self._first(upper.key)] = upper
        node.key, node.pages = node.key[at:], node.pages[at // self.ps :]
        node.parent = upper
        upper.children[self._first(node.key)] = node
        return upper

    def match(self, tokens: list[int]) -> tuple[Node, list[int]]:
        """Longest cached whole-page prefix of tokens: (deepest node, its pages from the root)."""
        node, pages, i = self.root, [], 0
        now = next(self._clock)
        while len(tokens) - i >= self.ps:
            child = node.children.get(self._first(tokens[i:]))
            if child is None:
                break
            m = self._match_len(child.key, tokens[i:])
            if m < len(child.key):
                child = self._split(child, m)
            child.last_used = now
            pages += child.pages
            i += m
            node = child
        return node, pages

    def lock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock == 0:
                self.evictable_pages -= len(node.pages)
                self.locked_pages += len(node.pages)
            node.lock += 1
            node = node.parent  # type: ignore[assignment]  # only the root has no parent

    def unlock(self, node: Node) -> None:
        while node is not self.root:
            node.lock -= 1
            assert node.lock >= 0, "radix lock underflow"
            if node.lock == 0:
                self.evictable_pages += len(node.pages)
                self.locked_pages -= len(node.pages)
            node = node.parent  # type: ignore[assignment]  # only the root has no parent

    def insert(self, tokens: list[int], pages: list[int]) -> int:
        """Insert a whole-page sequence; returns how many leading tokens were already cached
        (the caller frees its own pages for that part if they differ from the tree's)."""
        assert len(tokens) == len(pages) * self.ps
        node, i = self.root, 0
        now = next(self._clock)
        while i < len(tokens):
            child = node.children.get(self._first(tokens[i:]))
            if child is None:
                new = Node(tuple(tokens[i:]), list(pages[i // self.ps :]), node, {}, 0, now)
                node.children[self._first(new.key)] = new
                self.evictable_pages += len(new.pages)
                return i
            m = self._match_len(child.key, tokens[i:])
            if m < len(child.key):
                child = self._split(child, m)
            child.last_used = now
            i += m
            node = child
        return i

    def evict(self, n_pages: int) -> list[int]:
        """Remove least-recently-used unlocked leaves until n_pages are freed (or none are left)."""
        leaves = [(n.last_used, id(n), n) for n in self._nodes() if not n.children and n.lock == 0]
        heapq.heapify(leaves)
        freed: list[int] = []
        while leaves and len(freed) < n_pages:
            _, _, node = heapq.heappop(leaves)
            freed += node.pages
            self.evictable_pages -= len(node.pages)
            parent = node.parent
            assert parent is not None
            del parent.children[self._first(node.key)]
            if parent is not self.root and not parent.children and parent.lock == 0:
                heapq.heappush(leaves, (parent.last_used, id(parent), parent))
        return freed

    def _nodes(self) -> list[Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    def page_sets(self) -> tuple[list[int], list[int]]:
        """(locked pages, evictable pages), walked from the tree itself for invariant checks."""
        locked: list[int] = []
        free: list[int] = []
        for n in self._nodes():
            (locked if n.lock else free).extend(n.pages)
        return locked, free
