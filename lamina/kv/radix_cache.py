"""RadixCache: the prefix cache, a radix tree with one KV block per node (SGLang's RadixAttention at
block granularity).

    root ─┬─ (t0..t15) blk 7 ─┬─ (t16..t31) blk 3     a node's key is the `block_size` token ids of its
          │                   └─ (t16'..t31') blk 9   block; the path root -> node spells the prefix
          └─ (u0..u15) blk 4                          whose KV the node's block holds

Invariants:
  - a node's block is owned by the tree (the pool counts the tree as one holder, whatever locks it);
  - `lock_ref` = number of live requests whose block table runs through the node. A request locks every
    node of its path, so a locked node's ancestors are locked and the unlocked nodes form whole subtrees
    at the bottom: all of them can be evicted, leaves first, so `num_evictable` blocks are truly available;
  - every unlocked leaf has an entry `(last_access, seq, node)` in the eviction heap with its current
    `last_access` (entries that no longer match are stale and skipped when popped).
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from lamina.kv.block_pool import NULL_BLOCK_ID


@dataclass(eq=False, slots=True)
class Node:
    """One cached block: its tokens, its block id, and its place in the tree (compared by identity)."""

    key: tuple[int, ...]
    block_id: int
    parent: Node | None = field(default=None, repr=False)
    children: dict[tuple[int, ...], Node] = field(default_factory=dict, repr=False)
    lock_ref: int = 0
    last_access: int = 0
    evicted: bool = False


class RadixCache:
    """Block-granular radix tree with per-node lock counts and LRU eviction of unlocked leaves.

    Pure bookkeeping: `evict` returns the block ids it dropped; the caller gives them back to the pool.
    """

    def __init__(self, block_size: int) -> None:
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
        self.block_size = block_size
        self.root = Node(key=(), block_id=NULL_BLOCK_ID)
        self._num_nodes = 0
        self._num_evictable = 0
        self._clock = 0  # monotonic access counter: the LRU order
        self._seq = itertools.count()  # heap tie-breaker, so nodes are never compared
        self._heap: list[tuple[int, int, Node]] = []

    @property
    def num_nodes(self) -> int:
        """Blocks held by the tree."""
        return self._num_nodes

    @property
    def num_evictable(self) -> int:
        """Nodes with lock_ref 0: all of them can be evicted (leaves first)."""
        return self._num_evictable

    def match(self, token_ids: Sequence[int], max_blocks: int) -> list[Node]:
        """The longest cached path spelling full blocks of `token_ids`, at most `max_blocks` long.

        No side effects: the LRU clock moves only when a request locks or unlocks nodes.
        """
        bs = self.block_size
        node, path = self.root, []
        for i in range(min(max_blocks, len(token_ids) // bs)):
            child = node.children.get(tuple(token_ids[i * bs:(i + 1) * bs]))
            if child is None:
                break
            path.append(child)
            node = child
        return path

    def insert(self, parent: Node, key: tuple[int, ...], block_id: int) -> Node:
        """Add an unlocked child of `parent` holding `block_id`; the tree takes over the block."""
        if len(key) != self.block_size:
            raise ValueError(f"key must hold block_size={self.block_size} token ids, got {len(key)}")
        if parent.evicted or key in parent.children:
            raise ValueError("insert: parent is evicted or already has a child with this key (match first)")
        node = Node(key=key, block_id=block_id, parent=parent, last_access=self._tick())
        parent.children[key] = node
        self._num_nodes += 1
        self._num_evictable += 1
        self._push(node)
        return node

    def lock(self, nodes: Iterable[Node]) -> None:
        """One more live user of each node (pass a whole path: ancestors must be locked too)."""
        for node in nodes:
            if node.evicted:
                raise ValueError("cannot lock an evicted node (stale prefix match?)")
            if node.lock_ref == 0:
                self._num_evictable -= 1
            node.lock_ref += 1
            node.last_access = self._tick()

    def unlock(self, nodes: Iterable[Node]) -> None:
        """One user fewer for each node; a node left unlocked and childless becomes an eviction candidate."""
        for node in nodes:
            if node.lock_ref <= 0:
                raise ValueError(f"unlock of node (block {node.block_id}) that is not locked")
            node.lock_ref -= 1
            node.last_access = self._tick()
            if node.lock_ref == 0:
                self._num_evictable += 1
                if not node.children:
                    self._push(node)

    def evict(self, num_blocks: int) -> list[int]:
        """Drop up to `num_blocks` unlocked leaves, least recently used first; return their block ids.

        A parent left as an unlocked leaf joins the candidates, so whole unlocked subtrees drain.
        """
        freed: list[int] = []
        while len(freed) < num_blocks and self._heap:
            stamp, _, node = heapq.heappop(self._heap)
            if not self._is_candidate(node, stamp):
                continue
            self._remove(node)
            freed.append(node.block_id)
            parent = node.parent
            if parent is not self.root and parent.lock_ref == 0 and not parent.children:
                self._push(parent)
        return freed

    def iter_nodes(self) -> Iterator[Node]:
        """Every node but the root, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def check_integrity(self, expected_locks: Mapping[Node, int]) -> set[int]:
        """Assert the tree's structure, lock counts (vs `expected_locks`) and counters; return its block ids."""
        block_ids: set[int] = set()
        num_nodes = num_unlocked = 0
        for node in self.iter_nodes():
            self._check_node(node, expected_locks.get(node, 0))
            assert node.block_id not in block_ids, f"block {node.block_id} is held by two tree nodes"
            block_ids.add(node.block_id)
            num_nodes += 1
            num_unlocked += node.lock_ref == 0
        stray = [n.block_id for n in expected_locks if n.evicted or n is self.root]
        assert not stray, f"requests lock nodes that are not in the tree (blocks {stray})"
        assert num_nodes == self._num_nodes, f"tree counts {self._num_nodes} nodes but holds {num_nodes}"
        assert num_unlocked == self._num_evictable, \
            f"tree counts {self._num_evictable} evictable nodes but {num_unlocked} are unlocked"
        self._check_heap()
        return block_ids

    def _check_node(self, node: Node, expected_lock: int) -> None:
        parent = node.parent
        assert not node.evicted and parent is not None and parent.children.get(node.key) is node, \
            f"node of block {node.block_id} is not linked to its parent under its key"
        assert len(node.key) == self.block_size, f"node of block {node.block_id} has a key of {len(node.key)}"
        assert node.block_id != NULL_BLOCK_ID, "the null block is held by a tree node"
        assert node.lock_ref == expected_lock, \
            f"node of block {node.block_id} has lock_ref {node.lock_ref} but {expected_lock} live requests lock it"
        assert parent is self.root or parent.lock_ref >= node.lock_ref, \
            f"node of block {node.block_id} is locked more often than its parent (block {parent.block_id})"

    def _check_heap(self) -> None:
        candidates = {id(node) for stamp, _, node in self._heap if self._is_candidate(node, stamp)}
        missing = [n.block_id for n in self.iter_nodes()
                   if n.lock_ref == 0 and not n.children and id(n) not in candidates]
        assert not missing, f"unlocked leaves (blocks {missing}) are missing from the eviction heap"

    def _is_candidate(self, node: Node, stamp: int) -> bool:
        return not node.evicted and node.lock_ref == 0 and not node.children and node.last_access == stamp

    def _remove(self, node: Node) -> None:
        del node.parent.children[node.key]
        node.evicted = True
        self._num_nodes -= 1
        self._num_evictable -= 1

    def _push(self, node: Node) -> None:
        heapq.heappush(self._heap, (node.last_access, next(self._seq), node))
        # Lock/unlock churn leaves stale entries behind; compact so the heap stays O(num_nodes).
        if len(self._heap) > 2 * self._num_nodes + 64:
            self._compact()

    def _compact(self) -> None:
        seen: set[int] = set()
        live = []
        for entry in self._heap:
            node = entry[2]
            if self._is_candidate(node, entry[0]) and id(node) not in seen:
                seen.add(id(node))
                live.append(entry)
        heapq.heapify(live)
        self._heap = live

    def _tick(self) -> int:
        self._clock += 1
        return self._clock
