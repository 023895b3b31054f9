"""BlockPool: the ids of the paged KV cache's blocks, their reference counts and the free list.

Block ids index the per-layer KV tensors `[num_blocks, block_size, ...]` that the model runner owns;
the pool only hands out ids. Block 0 is the reserved null block (block tables are padded with it):
it is never free and never held.

Invariants, for every block b >= 1:

    ref_count(b) == number of holders of b   (each request holding it privately, or 1 for the prefix tree)
    b is on the free list  <=>  ref_count(b) == 0
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator, Mapping

NULL_BLOCK_ID = 0


class BlockPool:
    """Reference-counted block ids over a free list with O(1) pop, append and removal."""

    def __init__(self, num_blocks: int) -> None:
        if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks < 2:
            raise ValueError(f"num_blocks must be an integer >= 2 (block 0 is the reserved null block), "
                             f"got {num_blocks!r}")
        self.num_blocks = num_blocks
        self._ref_counts = [0] * num_blocks
        # An OrderedDict is a linked hash set: O(1) popitem from the head, append at the tail and
        # removal anywhere (a plain dict degrades to O(n) when popped from the head repeatedly).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))

    @property
    def num_free(self) -> int:
        """Blocks on the free list."""
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take `n` blocks off the free list, each with ref count 1. Callers check `num_free` first."""
        if n < 0 or n > len(self._free):
            raise ValueError(f"cannot allocate {n} blocks: n must be in [0, {len(self._free)}] (free blocks)")
        block_ids = [self._free.popitem(last=False)[0] for _ in range(n)]
        for block_id in block_ids:
            self._ref_counts[block_id] = 1
        return block_ids

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference per listed id (an id may repeat); a block whose count hits 0 is free again."""
        counts = Counter(block_ids)
        self._check_held(counts)  # validate everything first so a bad call changes nothing
        for block_id, count in counts.items():
            self._ref_counts[block_id] -= count
            if self._ref_counts[block_id] == 0:
                self._free[block_id] = None

    def incref(self, block_ids: Iterable[int]) -> None:
        """Add one reference per listed id: a new holder shares blocks that are already held."""
        counts = Counter(block_ids)
        self._check_held(counts, needed=False)
        for block_id, count in counts.items():
            self._ref_counts[block_id] += count

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def is_free(self, block_id: int) -> bool:
        return block_id in self._free

    def free_block_ids(self) -> Iterator[int]:
        """The free list in allocation order (head first)."""
        return iter(self._free)

    def check_integrity(self, expected_refs: Mapping[int, int]) -> None:
        """Assert that every block's ref count equals its number of holders (`expected_refs`)."""
        assert self._ref_counts[NULL_BLOCK_ID] == 0 and NULL_BLOCK_ID not in self._free, \
            f"null block {NULL_BLOCK_ID} is held (ref {self._ref_counts[NULL_BLOCK_ID]}) or on the free list"
        bad = [b for b in expected_refs if not 0 < b < self.num_blocks]
        assert not bad, f"holders name blocks {bad} outside the usable range [1, {self.num_blocks})"
        for block_id in range(1, self.num_blocks):
            holders = expected_refs.get(block_id, 0)
            ref = self._ref_counts[block_id]
            assert not (holders and block_id in self._free), f"block {block_id} is both free and held"
            assert holders or block_id in self._free, f"block {block_id} is neither free nor held (leaked)"
            assert ref == holders, f"block {block_id} has ref count {ref} but {holders} holders"

    def _check_held(self, counts: Counter[int], needed: bool = True) -> None:
        for block_id, count in counts.items():
            if not 0 < block_id < self.num_blocks:
                raise ValueError(f"block id {block_id} out of range: must be in [1, {self.num_blocks})")
            ref = self._ref_counts[block_id]
            if ref == 0 or (needed and ref < count):
                raise ValueError(f"block {block_id} has ref count {ref}: cannot drop/share {count} references")
