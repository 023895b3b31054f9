from __future__ import annotations

import pytest

from lamina.kv.radix_cache import Node, RadixCache

BS = 2


def chain(tree: RadixCache, keys: list[tuple[int, ...]], first_block: int, parent: Node | None = None) -> list[Node]:
    """Insert a path of nodes with consecutive block ids under `parent` (the root by default)."""
    node, path = parent or tree.root, []
    for i, key in enumerate(keys):
        node = tree.insert(node, key, first_block + i)
        path.append(node)
    return path


def evict_order(tree: RadixCache) -> list[int]:
    order = []
    while block := tree.evict(1):
        order += block
    return order


def test_match_walks_full_blocks_and_respects_max_blocks() -> None:
    tree = RadixCache(BS)
    a, b = chain(tree, [(1, 2), (3, 4)], first_block=10)
    (c,) = chain(tree, [(5, 6)], first_block=20, parent=a)
    assert tree.match([1, 2, 3, 4, 7], max_blocks=9) == [a, b]
    assert tree.match([1, 2, 5, 6], max_blocks=9) == [a, c]
    assert tree.match([1, 2, 3, 4], max_blocks=1) == [a]
    assert tree.match([1, 2, 3], max_blocks=9) == [a]  # a partial block never matches
    assert tree.match([1, 2, 9, 9, 3, 4], max_blocks=9) == [a]
    assert tree.match([2, 1], max_blocks=9) == []
    assert tree.num_nodes == 3 and tree.num_evictable == 3


def test_match_has_no_side_effects() -> None:
    tree = RadixCache(BS)
    path = chain(tree, [(1, 2), (3, 4)], first_block=1)
    stamps = [n.last_access for n in path]
    tree.match([1, 2, 3, 4], max_blocks=2)
    assert [n.last_access for n in path] == stamps
    assert all(n.lock_ref == 0 for n in path) and tree.num_evictable == 2


def test_insert_rejects_bad_keys() -> None:
    tree = RadixCache(BS)
    chain(tree, [(1, 2)], first_block=1)
    with pytest.raises(ValueError, match="block_size=2"):
        tree.insert(tree.root, (1, 2, 3), 5)
    with pytest.raises(ValueError, match="already has a child"):
        tree.insert(tree.root, (1, 2), 5)


def test_eviction_takes_unlocked_leaves_in_lru_order() -> None:
    tree = RadixCache(BS)
    leaves = {block: chain(tree, [(block, block)], first_block=block)[0] for block in (1, 2, 3, 4)}
    for block in (3, 1, 4, 2):  # touch order: 3 is now least recently used, 2 most
        tree.lock([leaves[block]])
        tree.unlock([leaves[block]])
    assert tree.evict(2) == [3, 1]
    assert tree.num_nodes == 2 and tree.num_evictable == 2
    assert tree.match([3, 3], 1) == [] and tree.match([4, 4], 1) == [leaves[4]]
    assert tree.evict(5) == [4, 2]
    assert tree.evict(1) == [] and tree.num_nodes == 0


def test_release_time_not_lock_time_sets_the_lru_order() -> None:
    tree = RadixCache(BS)
    (long_running,) = chain(tree, [(1, 1)], first_block=1)
    (short,) = chain(tree, [(2, 2)], first_block=2)
    tree.lock([long_running])
    tree.lock([short])
    tree.unlock([short])
    tree.unlock([long_running])  # used until now: the most recently used block
    assert tree.evict(1) == [2]


def test_locked_nodes_are_never_evicted() -> None:
    tree = RadixCache(BS)
    path = chain(tree, [(1, 1), (2, 2), (3, 3)], first_block=1)
    (other,) = chain(tree, [(9, 9)], first_block=9)
    tree.lock(path[:2])  # a request holding the first two blocks: the third is an unlocked leaf
    assert tree.num_evictable == 2
    assert sorted(tree.evict(10)) == [3, 9]
    assert tree.num_nodes == 2 and tree.num_evictable == 0
    assert tree.match([1, 1, 2, 2], 9) == path[:2] and other.evicted
    tree.unlock(path[:2])
    assert tree.num_evictable == 2
    assert tree.evict(10) == [2, 1]


def test_parent_is_evicted_only_after_all_its_children() -> None:
    tree = RadixCache(BS)
    a, b, c = chain(tree, [(1, 1), (2, 2), (3, 3)], first_block=1)
    (d,) = chain(tree, [(4, 4)], first_block=4, parent=a)
    (e,) = chain(tree, [(5, 5)], first_block=5)
    # The root of the subtree is the least recently used node, yet its descendants must go first.
    for node in (a, b, c, d, e):
        tree.lock([node])
        tree.unlock([node])
    order = evict_order(tree)
    assert sorted(order) == [1, 2, 3, 4, 5]
    pos = {block: i for i, block in enumerate(order)}
    assert pos[1] > pos[2] > pos[3] and pos[1] > pos[4]
    # c is the oldest leaf; b, older than d, becomes a leaf once c is gone; a (oldest) only after d.
    assert order == [3, 2, 4, 1, 5]


def test_lock_counts_and_unlock_errors() -> None:
    tree = RadixCache(BS)
    a, b = chain(tree, [(1, 1), (2, 2)], first_block=1)
    tree.lock([a, b])
    tree.lock([a])
    assert (a.lock_ref, b.lock_ref, tree.num_evictable) == (2, 1, 0)
    tree.unlock([a, b])
    assert (a.lock_ref, b.lock_ref, tree.num_evictable) == (1, 0, 1)
    assert tree.evict(5) == [2]  # a is still locked
    with pytest.raises(ValueError, match="not locked"):
        tree.unlock([b])
    with pytest.raises(ValueError, match="evicted"):
        tree.lock([b])
    tree.check_integrity({a: 1})


def test_heap_stays_bounded_under_lock_churn() -> None:
    tree = RadixCache(BS)
    leaves = [chain(tree, [(i, i)], first_block=i)[0] for i in range(1, 6)]
    for _ in range(2000):
        for leaf in leaves:
            tree.lock([leaf])
            tree.unlock([leaf])
    assert len(tree._heap) <= 2 * tree.num_nodes + 65
    tree.check_integrity({})
    assert evict_order(tree) == [1, 2, 3, 4, 5]


def test_check_integrity_catches_wrong_lock_counts() -> None:
    tree = RadixCache(BS)
    a, b = chain(tree, [(1, 1), (2, 2)], first_block=1)
    tree.lock([a, b])
    assert tree.check_integrity({a: 1, b: 1}) == {1, 2}
    with pytest.raises(AssertionError, match="lock_ref 1 but 0 live requests"):
        tree.check_integrity({a: 1})
    tree.lock([b])  # a child locked more often than its parent: some request skipped an ancestor
    with pytest.raises(AssertionError, match="locked more often than its parent"):
        tree.check_integrity({a: 1, b: 2})
