"""KVCacheManager: the scheduler's only window on the KV cache (block ids, never tensors). It owns the
block tables: nothing else writes them.

A token at position p of a request lives in block `block_ids(request_id)[p // block_size]`, slot
`p % block_size`. Every live request's block table has two parts:

    block_ids(request_id) = [ tree nodes it locks ... | private blocks ... ]
                          ^ its prefix-cache path    ^ ref-counted in the pool, shared only by fork()
                            (committed or hit)         when prefix caching is off

Every usable block is in exactly one place:

    num_free + num_cached (tree nodes) + distinct private blocks of live requests + 1 (null) == num_blocks

A cached node is evictable while no request locks it, so blocks available to allocate = free + evictable.

The worker keeps a copy of each table; `take_block_update` hands out what changed since the last call:

    table:  | entries the worker has, unchanged ...  | appended, or rewritten by a commit |
            0                                        ^ start   (the update is table[start:])
"""
from __future__ import annotations

from collections import Counter

from lamina.kv.block_pool import BlockPool
from lamina.kv.radix_cache import Node, RadixCache
from lamina.kv.types import KVRequest, PrefixCacheStats, PrefixMatch


class KVCacheManager:
    """Block tables for requests: allocation, prefix-cache hits and commits, fork, free, eviction."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._pool = BlockPool(num_blocks)
        self._tree = RadixCache(block_size)
        self._held: dict[str, KVRequest] = {}  # live requests holding blocks
        self._tables: dict[str, list[int]] = {}  # request id -> its block table
        self._synced: dict[str, int] = {}  # request id -> leading table entries the worker has unchanged
        self._nodes: dict[str, list[Node]] = {}  # request id -> the tree path leading its block table
        self._queries = 0
        self._hits = 0

    # --- the scheduler's API -------------------------------------------------------------------------

    def block_ids(self, request_id: str) -> list[int]:
        """The request's block table ([] when it holds no blocks); a live list: do not mutate."""
        return self._tables.get(request_id, [])

    def take_block_update(self, request_id: str) -> tuple[int, list[int]]:
        """(start, table[start:]): the entries changed since the last call for this request (all of them
        the first time); the worker applies it as table[start:] = ids."""
        table = self._tables.get(request_id)
        if table is None:
            return 0, []
        start, end = self._synced.get(request_id, 0), len(table)
        self._synced[request_id] = end
        return (end, []) if start >= end else (start, table[start:])

    def match_prefix(self, request: KVRequest) -> PrefixMatch:
        """Longest cached prefix of the request's tokens, capped so its last token is always computed."""
        if not self.enable_prefix_caching:
            return PrefixMatch()
        max_blocks = max(0, (request.num_tokens - 1) // self.block_size)
        nodes = self._tree.match(request.all_token_ids, max_blocks)
        return PrefixMatch(nodes=nodes, num_tokens=len(nodes) * self.block_size)

    def allocate_slots(self, request: KVRequest, num_new_tokens: int, prefix: PrefixMatch | None = None) -> bool:
        """Grow the block table to cover `base + num_new_tokens` tokens; all or nothing.

        base = `prefix.num_tokens` when a prefix is given (the request must hold no blocks; its table then
        starts with the prefix's blocks, locked), else `request.num_computed_tokens`. Evicts LRU cached
        blocks when the free list is short. Returns False, changing nothing, when it cannot be satisfied.
        """
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        table = self.block_ids(request.request_id)
        if prefix is None and request.num_computed_tokens + num_new_tokens <= len(table) * self.block_size:
            return True  # the blocks held already cover it (most decode steps)
        nodes = self._check_prefix(request, prefix)
        if prefix is None:
            base, held = request.num_computed_tokens, len(table)
        else:
            base, held = prefix.num_tokens, len(nodes)
        num_new = max(0, -(-(base + num_new_tokens) // self.block_size) - held)
        # Locking prefix nodes that are now evictable takes them out of what eviction can reclaim.
        newly_locked = sum(1 for node in nodes if node.lock_ref == 0)
        if num_new > self._pool.num_free + self._tree.num_evictable - newly_locked:
            return False
        if prefix is not None:
            self._tree.lock(nodes)
            table = [node.block_id for node in nodes]
            self._queries += request.num_tokens
            self._hits += prefix.num_tokens
        table = table + self._take(num_new)
        if table and request.request_id not in self._held:
            self._held[request.request_id] = request
            self._nodes[request.request_id] = list(nodes)
        if table:
            self._tables[request.request_id] = table
        return True

    def commit(self, request: KVRequest, num_tokens: int) -> None:
        """Cache the full blocks covering the request's first `num_tokens` tokens (verified, KV computed).

        Already-committed blocks are skipped. When the tree already holds the same block under the same
        parent (another request computed it too), the request's copy is freed and its table switched to
        the tree's block. No-op when prefix caching is off.
        """
        if not self.enable_prefix_caching:
            return
        if not 0 <= num_tokens <= request.num_tokens:
            raise ValueError(f"num_tokens must be in [0, {request.num_tokens}] (request.num_tokens), "
                             f"got {num_tokens}")
        num_full = num_tokens // self.block_size
        if num_full > len(self.block_ids(request.request_id)):
            raise ValueError(f"commit of {num_full} full blocks but request {request.request_id!r} holds "
                             f"{len(self.block_ids(request.request_id))}")
        if num_full <= len(self._nodes.get(request.request_id, [])):
            return
        nodes = self._nodes[request.request_id]  # holds blocks, so allocate_slots/fork registered it
        parent = nodes[-1] if nodes else self._tree.root
        for index in range(len(nodes), num_full):
            parent = self._commit_block(request, index, parent)
            nodes.append(parent)

    def fork(self, parent: KVRequest, child: KVRequest, num_tokens: int) -> int:
        """Share the parent's full blocks within its first `num_tokens` tokens with `child` (holding none).

        For n > 1 parallel samples: the shared tokens' KV must be computed. Returns the number of tokens
        shared (a multiple of block_size). With prefix caching on, those blocks are committed first and the
        child locks the tree path, so private blocks are never shared while the tree may adopt them.
        """
        if child.request_id in self._tables or child.request_id in self._held:
            raise ValueError(f"fork: child {child.request_id!r} already holds blocks")
        if not 0 <= num_tokens <= parent.num_tokens:
            raise ValueError(f"num_tokens must be in [0, {parent.num_tokens}] (parent.num_tokens), got {num_tokens}")
        parent_table = self.block_ids(parent.request_id)
        num_blocks = min(num_tokens // self.block_size, len(parent_table))
        shared = num_blocks * self.block_size
        if child.all_token_ids[:shared] != parent.all_token_ids[:shared]:
            raise ValueError("fork: the child's first tokens differ from the parent's")
        if num_blocks == 0:
            return 0
        if self.enable_prefix_caching:
            self.commit(parent, shared)
            nodes = self._nodes[parent.request_id][:num_blocks]
            self._tree.lock(nodes)
        else:
            nodes = []
            self._pool.incref(parent_table[:num_blocks])
        self._tables[child.request_id] = list(parent_table[:num_blocks])
        self._nodes[child.request_id] = list(nodes)
        self._held[child.request_id] = child
        return shared

    def free(self, request: KVRequest) -> None:
        """Unlock the request's tree nodes (they stay cached) and release its private blocks."""
        nodes = self._nodes.pop(request.request_id, [])
        self._held.pop(request.request_id, None)
        self._synced.pop(request.request_id, None)
        self._tree.unlock(nodes)
        private = self._tables.pop(request.request_id, [])[len(nodes):]
        if private:
            self._pool.free(private)

    def reset_prefix_cache(self) -> bool:
        """Drop every unlocked cached block; True if the tree is empty afterwards (nothing was locked)."""
        self._pool.free(self._tree.evict(self._tree.num_evictable))
        return self._tree.num_nodes == 0

    # --- read-outs ----------------------------------------------------------------------------------

    @property
    def num_total_blocks(self) -> int:
        """Usable blocks (all but the null block)."""
        return self._pool.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        return self._pool.num_free

    @property
    def num_cached_blocks(self) -> int:
        return self._tree.num_nodes

    @property
    def num_evictable_blocks(self) -> int:
        return self._tree.num_evictable

    @property
    def usage(self) -> float:
        """Fraction of usable blocks in use: neither free nor evictable."""
        available = self._pool.num_free + self._tree.num_evictable
        return 1.0 - available / self.num_total_blocks

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self._pool.num_free + self._tree.num_evictable

    @property
    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(queries=self._queries, hits=self._hits)

    @property
    def block_pool(self) -> BlockPool:
        return self._pool

    @property
    def radix_cache(self) -> RadixCache:
        return self._tree

    def check_integrity(self) -> None:
        """Assert that every block is accounted for exactly once and every count matches its holders."""
        refs: Counter[int] = Counter()
        locks: Counter[Node] = Counter()
        private: set[int] = set()
        for request_id, request in self._held.items():
            nodes = self._nodes.get(request_id, [])
            self._check_request(request_id, request, nodes)
            locks.update(nodes)
            refs.update(self.block_ids(request_id)[len(nodes):])
            private.update(self.block_ids(request_id)[len(nodes):])
        cached = self._tree.check_integrity(locks)
        both = sorted(cached & private)
        assert not both, f"blocks {both} are both cached tree nodes and private to a request"
        refs.update(cached)
        self._pool.check_integrity(refs)
        total = self._pool.num_free + len(cached) + len(private) + 1
        assert total == self._pool.num_blocks, (
            f"free {self._pool.num_free} + cached {len(cached)} + private {len(private)} + 1 null = {total} "
            f"!= num_blocks {self._pool.num_blocks}")
        assert self._held or not (private or locks), "no live requests, yet private blocks or locks remain"

    # --- helpers ------------------------------------------------------------------------------------

    def _check_prefix(self, request: KVRequest, prefix: PrefixMatch | None) -> list[Node]:
        if prefix is None:
            return []
        if request.request_id in self._tables or request.request_id in self._held:
            raise ValueError(f"allocate_slots: a prefix is only allowed for a request holding no blocks, "
                             f"but {request.request_id!r} holds {len(self.block_ids(request.request_id))}")
        if prefix.nodes and not self.enable_prefix_caching:
            raise ValueError("allocate_slots: a non-empty prefix given while prefix caching is off")
        if prefix.num_tokens != len(prefix.nodes) * self.block_size:
            raise ValueError(f"prefix.num_tokens must be len(prefix.nodes) * block_size = "
                             f"{len(prefix.nodes) * self.block_size}, got {prefix.num_tokens}")
        if any(node.evicted for node in prefix.nodes):
            raise ValueError("allocate_slots: stale prefix (a matched block was evicted since match_prefix)")
        return prefix.nodes

    def _take(self, num_blocks: int) -> list[int]:
        short = num_blocks - self._pool.num_free
        if short > 0:
            self._pool.free(self._tree.evict(short))
        return self._pool.allocate(num_blocks)

    def _commit_block(self, request: KVRequest, index: int, parent: Node) -> Node:
        bs = self.block_size
        key = tuple(request.all_token_ids[index * bs:(index + 1) * bs])
        table = self._tables[request.request_id]
        block_id = table[index]
        node = parent.children.get(key)
        if node is None:
            if self._pool.ref_count(block_id) != 1:
                raise RuntimeError(f"commit: private block {block_id} is shared; the tree cannot adopt it")
            node = self._tree.insert(parent, key, block_id)  # the request's reference becomes the tree's
        else:
            self._pool.free([block_id])  # computed concurrently by another request: keep the tree's copy
            table[index] = node.block_id
            synced = self._synced.get(request.request_id, 0)
            self._synced[request.request_id] = min(synced, index)  # the worker must see the swap
        self._tree.lock([node])
        return node

    def _check_request(self, request_id: str, request: KVRequest, nodes: list[Node]) -> None:
        table = self.block_ids(request_id)
        assert request.request_id == request_id, f"request {request.request_id!r} registered as {request_id!r}"
        assert table, f"request {request_id!r} is registered but holds no blocks"
        assert len(set(table)) == len(table), f"request {request_id!r} holds a block twice: {table}"
        assert table[:len(nodes)] == [n.block_id for n in nodes], \
            f"request {request_id!r}: block table {table} does not start with its tree path"
        for above, node in zip([self._tree.root, *nodes], nodes):
            assert node.parent is above, f"request {request_id!r}: locked nodes do not form a path from the root"
