from __future__ import annotations

from collections.abc import Callable

import pytest

from lamina.engine.request import Request
from lamina.kv.kv_manager import KVCacheManager
from lamina.kv.types import PrefixCacheStats, PrefixMatch
from lamina.sampling_params import SamplingParams


def make_request(request_id: str, token_ids: list[int]) -> Request:
    return Request(request_id, list(token_ids), SamplingParams())


def run_prefill(mgr: KVCacheManager, req: Request, commit: bool = True) -> None:
    """Admit `req` with its prefix hit, compute its whole prompt, commit it."""
    prefix = mgr.match_prefix(req)
    assert mgr.allocate_slots(req, req.num_tokens - prefix.num_tokens, prefix)
    req.num_computed_tokens = req.num_tokens
    if commit:
        mgr.commit(req, req.num_tokens)


def snapshot(mgr: KVCacheManager, *reqs: Request) -> tuple:
    return (mgr.num_free_blocks, mgr.num_cached_blocks, mgr.num_evictable_blocks, mgr.stats,
            [list(mgr.block_ids(r.request_id)) for r in reqs], list(mgr.block_pool.free_block_ids()))


def test_allocation_grows_across_block_boundaries() -> None:
    mgr = KVCacheManager(num_blocks=10, block_size=4, enable_prefix_caching=False)
    req = make_request("a", list(range(10)))
    assert mgr.allocate_slots(req, 10)
    assert len(mgr.block_ids(req.request_id)) == 3 and 0 not in mgr.block_ids(req.request_id)
    req.num_computed_tokens = 10
    assert mgr.allocate_slots(req, 2) and len(mgr.block_ids(req.request_id)) == 3  # 12 tokens still fit
    first = list(mgr.block_ids(req.request_id))
    assert mgr.allocate_slots(req, 3) and len(mgr.block_ids(req.request_id)) == 4  # 13 tokens need a 4th block
    assert mgr.block_ids(req.request_id)[:3] == first
    assert mgr.num_free_blocks == 9 - 4 and mgr.usage == pytest.approx(4 / 9)
    mgr.check_integrity()
    mgr.free(req)
    mgr.free(req)  # idempotent
    assert mgr.block_ids(req.request_id) == [] and mgr.num_free_blocks == 9
    mgr.check_integrity()


def test_failed_allocation_changes_nothing() -> None:
    mgr = KVCacheManager(num_blocks=5, block_size=4, enable_prefix_caching=True)
    a, b = make_request("a", list(range(12))), make_request("b", [7] * 5)
    run_prefill(mgr, a, commit=False)
    before = snapshot(mgr, a, b)
    assert not mgr.allocate_slots(b, 5, mgr.match_prefix(b))  # needs 2 blocks, 1 is free
    assert not mgr.allocate_slots(a, 5)  # growing a running request past the pool
    assert snapshot(mgr, a, b) == before and not mgr.can_allocate(2) and mgr.can_allocate(1)
    mgr.check_integrity()


def test_locking_an_evictable_prefix_is_accounted_for_atomically() -> None:
    mgr = KVCacheManager(num_blocks=5, block_size=2, enable_prefix_caching=True)
    a = make_request("a", [1, 2, 3, 4, 5, 6])
    run_prefill(mgr, a)
    mgr.free(a)  # 3 cached (evictable) blocks + 1 free block
    b = make_request("b", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    prefix = mgr.match_prefix(b)
    assert prefix.num_tokens == 6
    # 2 new blocks: free (1) + evictable (3) looks enough, but locking the hit leaves only 1.
    before = snapshot(mgr, b)
    assert not mgr.allocate_slots(b, 3, prefix)
    assert snapshot(mgr, b) == before and all(n.lock_ref == 0 for n in prefix.nodes)
    mgr.check_integrity()
    assert mgr.allocate_slots(b, 1, prefix)  # one new block fits
    assert mgr.block_ids("b")[:3] == [n.block_id for n in prefix.nodes] and len(mgr.block_ids("b")) == 4
    assert mgr.stats == PrefixCacheStats(queries=6 + 9, hits=6)
    mgr.check_integrity()


def test_a_prefix_locked_by_another_request_costs_nothing_to_lock() -> None:
    mgr = KVCacheManager(num_blocks=6, block_size=2, enable_prefix_caching=True)
    a = make_request("a", [1, 2, 3, 4, 5, 6])
    run_prefill(mgr, a)  # a keeps its 3 cached blocks locked; 2 blocks are free
    b = make_request("b", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    prefix = mgr.match_prefix(b)
    assert mgr.allocate_slots(b, 3, prefix)  # exactly the 2 free blocks
    assert mgr.num_free_blocks == 0 and [n.lock_ref for n in prefix.nodes] == [2, 2, 2]
    mgr.check_integrity()


def test_hit_is_capped_so_the_last_token_is_computed() -> None:
    mgr = KVCacheManager(num_blocks=10, block_size=4, enable_prefix_caching=True)
    run_prefill(mgr, make_request("a", list(range(8))))
    exact = make_request("b", list(range(8)))  # exactly 2 blocks
    assert mgr.match_prefix(exact).num_tokens == 4
    assert mgr.match_prefix(make_request("c", list(range(9)))).num_tokens == 8
    assert mgr.match_prefix(make_request("d", [0, 1, 2, 3, 9, 9, 9, 9, 9])).num_tokens == 4
    assert mgr.match_prefix(make_request("e", [5])).num_tokens == 0
    off = KVCacheManager(num_blocks=10, block_size=4, enable_prefix_caching=False)
    run_prefill(off, make_request("a", list(range(8))))
    assert off.num_cached_blocks == 0 and off.match_prefix(make_request("c", list(range(9)))).nodes == []


def test_match_prefix_has_no_side_effects() -> None:
    mgr = KVCacheManager(num_blocks=10, block_size=4, enable_prefix_caching=True)
    a = make_request("a", list(range(9)))
    run_prefill(mgr, a)
    mgr.free(a)
    nodes = mgr.match_prefix(make_request("b", list(range(9)))).nodes
    assert len(nodes) == 2 and mgr.num_evictable_blocks == 2 and mgr.stats.queries == 9
    assert all(n.lock_ref == 0 for n in nodes)


def test_commit_of_a_block_computed_twice_keeps_one_copy() -> None:
    mgr = KVCacheManager(num_blocks=10, block_size=4, enable_prefix_caching=True)
    a, b = make_request("a", list(range(10))), make_request("b", list(range(10)))
    run_prefill(mgr, a, commit=False)
    run_prefill(mgr, b, commit=False)  # both computed the same prompt concurrently
    b_private = list(mgr.block_ids(b.request_id))
    mgr.commit(a, 10)
    free_before = mgr.num_free_blocks
    mgr.commit(b, 10)
    b_table = mgr.block_ids(b.request_id)
    assert b_table[:2] == mgr.block_ids(a.request_id)[:2] and b_table[2] == b_private[2]
    assert mgr.num_free_blocks == free_before + 2 and mgr.block_pool.is_free(b_private[0])
    assert mgr.num_cached_blocks == 2
    assert [n.lock_ref for n in mgr.match_prefix(make_request("c", list(range(9)))).nodes] == [2, 2]
    mgr.commit(b, 10)  # committed blocks are skipped
    mgr.check_integrity()
    mgr.free(a)
    mgr.free(b)
    assert mgr.num_evictable_blocks == 2 and mgr.num_free_blocks == 7
    mgr.check_integrity()


def test_commit_extends_the_path_block_by_block_and_branches() -> None:
    mgr = KVCacheManager(num_blocks=10, block_size=2, enable_prefix_caching=True)
    a = make_request("a", [1, 1, 2, 2, 3])
    b = make_request("b", [1, 1, 4, 4, 5])
    run_prefill(mgr, a, commit=False)
    mgr.commit(a, 3)
    assert mgr.num_cached_blocks == 1
    mgr.commit(a, 5)
    run_prefill(mgr, b)  # hits [1, 1], inserts [4, 4] as a sibling of [2, 2]
    assert mgr.block_ids("b")[0] == mgr.block_ids("a")[0] and mgr.block_ids("b")[1] != mgr.block_ids("a")[1]
    assert mgr.num_cached_blocks == 3 and mgr.stats == PrefixCacheStats(queries=10, hits=2)
    mgr.check_integrity()
    with pytest.raises(ValueError, match="num_tokens"):
        mgr.commit(a, 6)


def test_eviction_under_pressure_drops_the_least_recently_used_leaf() -> None:
    mgr = KVCacheManager(num_blocks=7, block_size=2, enable_prefix_caching=True)
    old, new = make_request("old", [1, 1, 1, 1]), make_request("new", [2, 2, 2, 2])
    for req in (old, new):
        run_prefill(mgr, req)
    mgr.free(old)
    mgr.free(new)
    assert (mgr.num_free_blocks, mgr.num_evictable_blocks, mgr.usage) == (2, 4, 0.0)
    big = make_request("big", [3] * 6)
    assert mgr.allocate_slots(big, 6, mgr.match_prefix(big))  # 3 blocks: evicts 1
    assert mgr.num_cached_blocks == 3 and mgr.num_free_blocks == 0
    assert mgr.match_prefix(make_request("x", [1, 1, 1, 1, 0])).num_tokens == 2  # old lost its leaf
    assert mgr.match_prefix(make_request("y", [2, 2, 2, 2, 0])).num_tokens == 4
    mgr.check_integrity()


def test_fork_shares_full_blocks_without_prefix_cache() -> None:
    mgr = KVCacheManager(num_blocks=10, block_size=4, enable_prefix_caching=False)
    parent = make_request("p", list(range(10)))
    run_prefill(mgr, parent)
    child = make_request("c", list(range(10)))
    assert mgr.fork(parent, child, 10) == 8
    assert mgr.block_ids(child.request_id) == mgr.block_ids(parent.request_id)[:2]
    assert [mgr.block_pool.ref_count(b) for b in mgr.block_ids(parent.request_id)] == [2, 2, 1]
    child.num_computed_tokens = 8
    assert mgr.allocate_slots(child, 2) and mgr.block_ids(child.request_id)[2] not in mgr.block_ids(parent.request_id)
    mgr.check_integrity()
    mgr.free(parent)
    assert [mgr.block_pool.ref_count(b) for b in mgr.block_ids(child.request_id)] == [1, 1, 1]
    mgr.check_integrity()
    mgr.free(child)
    assert mgr.num_free_blocks == 9
    mgr.check_integrity()


def test_fork_with_prefix_cache_locks_the_tree_path() -> None:
    mgr = KVCacheManager(num_blocks=10, block_size=4, enable_prefix_caching=True)
    parent = make_request("p", list(range(10)))
    run_prefill(mgr, parent, commit=False)
    child = make_request("c", list(range(10)))
    assert mgr.fork(parent, child, 9) == 8
    assert mgr.block_ids(child.request_id) == mgr.block_ids(parent.request_id)[:2] and mgr.num_cached_blocks == 2
    assert [n.lock_ref for n in mgr.match_prefix(make_request("q", list(range(9)))).nodes] == [2, 2]
    mgr.check_integrity()
    with pytest.raises(ValueError, match="already holds blocks"):
        mgr.fork(parent, child, 8)
    with pytest.raises(ValueError, match="differ"):
        mgr.fork(parent, make_request("d", [9] * 10), 8)
    mgr.free(parent)
    mgr.free(child)
    assert mgr.num_evictable_blocks == 2 and mgr.num_free_blocks == 7
    mgr.check_integrity()


def test_stats_count_only_successful_prefixed_allocations() -> None:
    mgr = KVCacheManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    assert mgr.stats.hit_rate == 0.0
    run_prefill(mgr, make_request("a", [1, 1, 1]))
    b = make_request("b", [1, 1, 1, 1, 1, 1, 1, 1])
    assert not mgr.allocate_slots(b, 6, mgr.match_prefix(b))
    c = make_request("c", [1, 1, 2])
    run_prefill(mgr, c)
    assert mgr.stats == PrefixCacheStats(queries=6, hits=2) and mgr.stats.hit_rate == pytest.approx(1 / 3)


def test_reset_prefix_cache_keeps_locked_nodes() -> None:
    mgr = KVCacheManager(num_blocks=10, block_size=2, enable_prefix_caching=True)
    a, b = make_request("a", [1, 1, 2, 2, 3]), make_request("b", [5, 5, 6])
    run_prefill(mgr, a)
    run_prefill(mgr, b)
    mgr.free(b)
    assert not mgr.reset_prefix_cache()
    assert mgr.num_cached_blocks == 2 and mgr.num_evictable_blocks == 0
    mgr.free(a)
    assert mgr.reset_prefix_cache()
    assert mgr.num_cached_blocks == 0 and mgr.num_free_blocks == 9
    mgr.check_integrity()


def test_bad_calls_raise_clear_errors() -> None:
    mgr = KVCacheManager(num_blocks=10, block_size=2, enable_prefix_caching=True)
    a = make_request("a", [1, 1, 2])
    run_prefill(mgr, a)
    with pytest.raises(ValueError, match="num_new_tokens"):
        mgr.allocate_slots(a, -1)
    with pytest.raises(ValueError, match="holding no blocks"):
        mgr.allocate_slots(a, 1, PrefixMatch())
    mgr.free(a)
    b = make_request("b", [1, 1, 2])
    stale = mgr.match_prefix(b)
    assert mgr.reset_prefix_cache()
    with pytest.raises(ValueError, match="stale prefix"):
        mgr.allocate_slots(b, 1, stale)
    with pytest.raises(ValueError, match="block_size"):
        KVCacheManager(num_blocks=10, block_size=0, enable_prefix_caching=True)


@pytest.mark.parametrize("corrupt, message", [
    (lambda mgr, req: mgr.block_ids(req.request_id).append(next(mgr.block_pool.free_block_ids())),
     "both free and held"),
    (lambda mgr, req: mgr.block_pool.incref(mgr.block_ids(req.request_id)[-1:]), "ref count 2 but 1 holders"),
    (lambda mgr, req: mgr.radix_cache.lock(mgr.match_prefix(req).nodes), "lock_ref 2 but 1 live"),
    (lambda mgr, req: mgr.block_ids(req.request_id).pop(), "leaked"),
    (lambda mgr, req: mgr.block_ids(req.request_id).append(0), "outside the usable range"),
    (lambda mgr, req: mgr.block_ids(req.request_id).reverse(), "does not start with its tree path"),
])
def test_check_integrity_catches_corruption(corrupt: Callable[[KVCacheManager, Request], None],
                                            message: str) -> None:
    mgr = KVCacheManager(num_blocks=10, block_size=2, enable_prefix_caching=True)
    req = make_request("a", [1, 1, 2, 2, 3])
    run_prefill(mgr, req)
    mgr.check_integrity()
    corrupt(mgr, req)
    with pytest.raises(AssertionError, match=message):
        mgr.check_integrity()


def test_block_updates_carry_appends_and_the_swaps_of_a_commit() -> None:
    """What the worker is told: table[start:] changed since the last update (all of it the first time)."""
    mgr = KVCacheManager(num_blocks=12, block_size=4, enable_prefix_caching=True)
    a, b = make_request("a", list(range(10))), make_request("b", list(range(10)))
    run_prefill(mgr, a, commit=False)
    run_prefill(mgr, b, commit=False)
    assert mgr.take_block_update("b") == (0, mgr.block_ids("b")) and len(mgr.block_ids("b")) == 3
    assert mgr.take_block_update("b") == (3, [])
    mgr.commit(a, 10)
    mgr.commit(b, 10)  # b's first two blocks become a's cached ones
    assert mgr.take_block_update("b") == (0, mgr.block_ids("b"))
    b.num_computed_tokens = 12
    assert mgr.allocate_slots(b, 1)  # position 12 needs a fourth block
    assert mgr.take_block_update("b") == (3, mgr.block_ids("b")[3:])
    mgr.free(b)
    assert mgr.take_block_update("b") == (0, [])
    mgr.free(a)
    mgr.check_integrity()
