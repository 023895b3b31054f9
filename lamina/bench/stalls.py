"""Where a slow repeat's time went: the garbage collector's pauses and the steps far slower than their kind's median.

A benchmark row that is 0.6x in one repeat and 1.0x in the next (issue #12 at 128-256 rows on the H100/H200) is
either slow throughout or slow in a few places. `GcPauses` records every collection while a row runs (Python's
`gc.callbacks`: generation and wall time), and `stall_fields` names the steps that took more than STALL_FACTOR
times the median step of their kind (prefill, decode, verify, ...), with what they cost beyond that median:

    steps of one kind    |  3.6 |  3.7 |  3.5 | 41.0 |  3.6 |  ...      ms, median 3.6
    stall                                    ^ 41.0 > 4 x 3.6: one stalled step, 37.4 ms beyond the median

A repeat whose lost time is mostly `stall_ms` lost it to pauses (a collection, the host descheduling the process);
one with no stalls ran every step slower.
"""
from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Iterable
from types import TracebackType

STALL_FACTOR = 4.0  # a step slower than this many times its kind's median is a stall
FIELDS = ("slowest_step_ms", "stall_steps", "stall_ms", "gc_ms", "gc_full")  # stall_fields' and GcPauses.fields'


class GcPauses:
    """Within `with GcPauses() as pauses:`, `pauses.collections` holds (generation, seconds) of every garbage
    collection the process ran."""

    def __init__(self) -> None:
        self.collections: list[tuple[int, float]] = []
        self._started = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.collections.append((info["generation"], time.perf_counter() - self._started))

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        gc.callbacks.remove(self._callback)

    def fields(self) -> dict:
        """gc_ms: the collections' total wall time; gc_full: how many were full (generation 2)."""
        return {"gc_ms": 1000 * sum(s for _, s in self.collections),
                "gc_full": sum(generation == 2 for generation, _ in self.collections)}


def seconds_by_kind(steps: Iterable) -> dict[str, list[float]]:  # steps: lamina.engine.stats.StepStats
    """Each step kind's (prefill, decode, decode ahead, verify) wall times, in seconds, in the steps' order."""
    by_kind: dict[str, list[float]] = {}
    for step in steps:
        by_kind.setdefault(step.kind, []).append(step.seconds)
    return by_kind


def stall_fields(by_kind: dict[str, list[float]]) -> dict:
    """From seconds_by_kind: slowest_step_ms; stall_steps: the steps over STALL_FACTOR x their kind's median;
    stall_ms: their time beyond that median."""
    stalls = []
    for seconds in by_kind.values():
        median = statistics.median(seconds)
        stalls += [s - median for s in seconds if s > STALL_FACTOR * median]
    slowest = max((max(s) for s in by_kind.values()), default=0.0)
    return {"slowest_step_ms": 1000 * slowest, "stall_steps": len(stalls), "stall_ms": 1000 * sum(stalls)}
