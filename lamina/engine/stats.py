"""Counters the server and the benchmarks read: per engine and per step."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from lamina.engine.drafts import SpecDecodeStats
from lamina.kv.kv_manager import KVCacheManager

StepKind = Literal["prefill", "decode", "decode ahead", "verify", "verify ahead"]


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
    spec: SpecDecodeStats = field(default_factory=SpecDecodeStats)  # speculative decoding, when on

    def snapshot(self) -> SchedulerStats:
        """A copy that later steps do not change (for another thread to read)."""
        spec = dataclasses.replace(self.spec, accepted_per_pos=list(self.spec.accepted_per_pos))
        return dataclasses.replace(self, spec=spec)

    def record_step(self, num_tokens: int) -> None:
        self.num_steps += 1
        self.last_step_tokens = num_tokens
        self.total_scheduled_tokens += num_tokens

    def refresh(self, num_running: int, num_waiting: int, kv: KVCacheManager) -> SchedulerStats:
        """Set the gauges from the queue lengths and the KV cache; returns self."""
        self.num_running, self.num_waiting = num_running, num_waiting
        self.kv_limited = self.kv_limited and bool(num_waiting)
        self.kv_blocks_free = kv.num_free_blocks + kv.num_evictable_blocks
        self.kv_blocks_used = kv.num_total_blocks - self.kv_blocks_free
        self.kv_usage = kv.usage
        self.prefix_cache_queries, self.prefix_cache_hits = kv.stats.queries, kv.stats.hits
        return self

    @property
    def prefix_cache_hit_rate(self) -> float:
        if self.prefix_cache_queries == 0:
            return 0.0
        return self.prefix_cache_hits / self.prefix_cache_queries

    @property
    def mean_tokens_per_step(self) -> float:
        return self.total_scheduled_tokens / self.num_steps if self.num_steps else 0.0


@dataclass(frozen=True)
class StepStats:
    """One engine step, recorded while `LLMEngine.step_log` is a list (benchmarks, profiling).

    kind: "verify" when it verified drafts (speculative decoding); else "prefill" when some request computed
    more than one token, else "decode"; with " ahead" when it was launched during the step before it
    (Scheduler.schedule_ahead: "decode ahead"; Scheduler.schedule_guessed: "verify ahead")."""

    kind: StepKind
    num_tokens: int  # scheduled this step
    num_rows: int  # requests in the step
    seconds: float  # wall time of its LLMEngine.step(), its launch counted there even when it was launched ahead
    device_wait_s: float  # of which the host waited for the step's tokens
    compiles: int = 0  # Triton kernels compiled while the step was launched (a mid-run compile stalls it)

