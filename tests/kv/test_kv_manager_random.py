"""Randomized simulation: many fake requests allocate, commit, fork and free in random order over a
fake KV store that records which token prefix each slot holds, so a wrong hit or a block evicted
while in use is caught, not only a leaked block."""
from __future__ import annotations

import pytest

from lamina.engine.request import Request
from lamina.kv.kv_manager import KVCacheManager
from tests.kv.test_kv_manager import make_request, snapshot


class FakeEngine:
    """Drives the manager like the scheduler would, with a fake KV store to check what blocks hold.

    The "KV" written at a slot is the token prefix ending there (real KV depends on the whole prefix),
    so a wrong prefix hit, a wrongly shared block or a block evicted while in use shows up as a mismatch.
    """

    def __init__(self, seed: int, enable_prefix_caching: bool) -> None:
        import random
        self.rng = random.Random(seed)
        self.mgr = KVCacheManager(num_blocks=24, block_size=2, enable_prefix_caching=enable_prefix_caching)
        self.kv: dict[tuple[int, int], tuple[int, ...]] = {}
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.count = 0
        self.failures = 0

    def new_request(self, token_ids: list[int] | None = None) -> Request:
        self.count += 1
        tokens = token_ids or [self.rng.randrange(2) for _ in range(self.rng.randint(1, 12))]
        return make_request(f"r{self.count}", tokens)

    def compute(self, req: Request, n: int) -> None:
        bs = self.mgr.block_size
        for p in range(req.num_computed_tokens, req.num_computed_tokens + n):
            self.kv[self.mgr.block_ids(req.request_id)[p // bs], p % bs] = tuple(req.all_token_ids[:p + 1])
        req.num_computed_tokens += n
        if req.num_computed_tokens == req.num_tokens:
            req.append_output_token_ids([self.rng.randrange(2)])
        if self.rng.random() < 0.8:
            self.mgr.commit(req, req.num_computed_tokens)

    def verify(self, req: Request) -> None:
        bs, table = self.mgr.block_size, self.mgr.block_ids(req.request_id)
        for p in range(req.num_computed_tokens):
            assert self.kv.get((table[p // bs], p % bs)) == tuple(req.all_token_ids[:p + 1]), \
                f"{req.request_id}: wrong KV at position {p}"

    def admit(self) -> None:
        req = self.waiting.pop(0) if self.waiting and self.rng.random() < 0.5 else self.new_request()
        prefix = self.mgr.match_prefix(req)
        n = self.rng.randint(1, req.num_tokens - prefix.num_tokens)
        before = snapshot(self.mgr, req)
        if not self.mgr.allocate_slots(req, n + self.rng.randint(0, 2), prefix):
            assert snapshot(self.mgr, req) == before
            self.failures += 1
            self.waiting.insert(0, req)
            return
        req.num_computed_tokens = prefix.num_tokens
        self.verify(req)  # the hit must hold exactly this prefix's KV
        self.compute(req, n)
        self.running.append(req)

    def step(self, req: Request) -> None:
        n = self.rng.randint(1, req.num_tokens - req.num_computed_tokens)
        before = snapshot(self.mgr, req)
        if self.mgr.allocate_slots(req, n + self.rng.randint(0, 2)):  # extra slots: drafts, rolled back
            self.compute(req, n)
            return
        assert snapshot(self.mgr, req) == before
        self.failures += 1
        self.preempt(req)

    def preempt(self, req: Request) -> None:
        self.mgr.free(req)
        req.num_computed_tokens = 0
        self.running.remove(req)
        self.waiting.insert(0, req)

    def fork(self, parent: Request) -> None:
        child = self.new_request(list(parent.all_token_ids))
        child.num_computed_tokens = self.mgr.fork(parent, child, parent.num_computed_tokens)
        if self.mgr.block_ids(child.request_id):
            self.verify(child)
            self.running.append(child)

    def random_op(self) -> None:
        roll = self.rng.random()
        req = self.rng.choice(self.running) if self.running else None
        if req is None or roll < 0.25:
            self.admit()
        elif roll < 0.65:
            self.step(req)
        elif roll < 0.72:
            self.fork(req)
        elif roll < 0.82:
            self.preempt(req)
        elif roll < 0.995:
            self.mgr.free(req)
            self.running.remove(req)
        else:
            self.mgr.reset_prefix_cache()


@pytest.mark.parametrize("enable_prefix_caching", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_randomized_requests_never_leak_or_corrupt_blocks(seed: int, enable_prefix_caching: bool) -> None:
    engine = FakeEngine(seed, enable_prefix_caching)
    mgr = engine.mgr
    min_free = mgr.num_total_blocks
    for _ in range(1500):
        engine.random_op()
        mgr.check_integrity()
        for req in engine.running:
            engine.verify(req)
        min_free = min(min_free, mgr.num_free_blocks)
    assert engine.failures > 0 and min_free == 0  # the pool really was under pressure
    if enable_prefix_caching:
        assert mgr.stats.hits > 0 and mgr.num_cached_blocks > 0
    for req in list(engine.running):
        mgr.free(req)
    mgr.check_integrity()
    assert mgr.num_free_blocks + mgr.num_evictable_blocks == mgr.num_total_blocks
    assert mgr.num_evictable_blocks == mgr.num_cached_blocks and mgr.usage == 0.0
    assert mgr.reset_prefix_cache() and mgr.num_free_blocks == mgr.num_total_blocks
