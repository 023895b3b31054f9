"""Counters the server and the benchmarks read: per engine and per step."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SchedulerStats:
    """A snapshot of the scheduler and the KV cache after one step."""

    num_running: int = 0
    num_waiting: int = 0
    kv_limited: bool = False  # the last schedule left a waiting request out (or preempted) for lack of KV blocks
    kv_blocks_used: int = 0
    kv_blocks_free: int = 0  # free list + evictable cached blocks
    kv_usage: float = 0.0  # fraction of usable blocks held by requests
    prefix_cache_queries: int = 0  # prompt tokens looked up
    prefix_cache_hits: int = 0  # of which found in the cache
    num_preemptions: int = 0  # since start
    num_steps: int = 0
    last_step_tokens: int = 0
    total_scheduled_tokens: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        if self.prefix_cache_queries == 0:
            return 0.0
        return self.prefix_cache_hits / self.prefix_cache_queries

    @property
    def mean_tokens_per_step(self) -> float:
        return self.total_scheduled_tokens / self.num_steps if self.num_steps else 0.0
