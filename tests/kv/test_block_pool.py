from __future__ import annotations

import random
import time

import pytest

from lamina.kv.block_pool import BlockPool


def test_allocate_hands_out_every_usable_block_but_never_the_null_block() -> None:
    pool = BlockPool(8)
    assert pool.num_free == 7
    ids = pool.allocate(7)
    assert sorted(ids) == list(range(1, 8))
    assert pool.num_free == 0
    assert all(pool.ref_count(b) == 1 for b in ids)
    with pytest.raises(ValueError, match="cannot allocate 1 blocks"):
        pool.allocate(1)
    assert pool.allocate(0) == []


def test_free_returns_blocks_to_the_tail_of_the_free_list() -> None:
    pool = BlockPool(6)
    a, b = pool.allocate(2)
    assert list(pool.free_block_ids()) == [3, 4, 5]
    pool.free([b, a])
    assert list(pool.free_block_ids()) == [3, 4, 5, b, a]
    assert pool.ref_count(a) == 0 and pool.is_free(a)


def test_incref_keeps_a_shared_block_held_until_the_last_holder_frees_it() -> None:
    pool = BlockPool(4)
    (b,) = pool.allocate(1)
    pool.incref([b])
    assert pool.ref_count(b) == 2
    pool.free([b])
    assert pool.ref_count(b) == 1 and not pool.is_free(b) and pool.num_free == 2
    pool.free([b])
    assert pool.is_free(b) and pool.num_free == 3


def test_bad_free_and_incref_raise_and_change_nothing() -> None:
    pool = BlockPool(5)
    a, b = pool.allocate(2)
    free_before = list(pool.free_block_ids())
    with pytest.raises(ValueError):
        pool.free([a, 4])  # 4 is free
    with pytest.raises(ValueError):
        pool.free([a, a])  # only one reference exists
    with pytest.raises(ValueError):
        pool.free([0])  # the null block is never held
    with pytest.raises(ValueError):
        pool.incref([4])  # sharing needs an existing holder
    assert pool.ref_count(a) == 1 and pool.ref_count(b) == 1
    assert list(pool.free_block_ids()) == free_before
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(1)


def test_allocate_and_free_are_constant_time() -> None:
    # A list-backed free list (pop(0) / remove) or a plain dict popped from the head is quadratic here.
    n = 200_000
    pool = BlockPool(n + 1)
    start = time.perf_counter()
    ids = [pool.allocate(1)[0] for _ in range(n)]
    random.Random(0).shuffle(ids)
    for b in ids:
        pool.free([b])
    again = [pool.allocate(1)[0] for _ in range(n)]
    elapsed = time.perf_counter() - start
    assert again == ids  # FIFO: blocks come back in the order they were freed
    assert elapsed < 5.0, f"{3 * n} pool operations took {elapsed:.1f}s"


def test_check_integrity_compares_ref_counts_with_holders() -> None:
    pool = BlockPool(5)
    a, b = pool.allocate(2)
    pool.incref([a])
    pool.check_integrity({a: 2, b: 1})
    with pytest.raises(AssertionError, match=f"block {a} has ref count 2 but 1 holders"):
        pool.check_integrity({a: 1, b: 1})
    with pytest.raises(AssertionError, match="both free and held"):
        pool.check_integrity({a: 2, b: 1, 3: 1})
    with pytest.raises(AssertionError, match="leaked"):
        pool.check_integrity({a: 2})
    with pytest.raises(AssertionError, match="outside the usable range"):
        pool.check_integrity({a: 2, b: 1, 0: 1})
