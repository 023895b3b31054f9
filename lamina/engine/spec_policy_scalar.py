"""SpecPolicy's choice of drafts for a few requests, in plain Python (issue #12).

The numpy path of lamina/engine/spec_policy.py spends ~20 array operations on a call whatever the batch, about
0.1 ms on a 2-core host: the size of a whole demo-model step on the H200, paid twice a step at batch 1. Up to
SCALAR_MAX_REQUESTS requests these functions make the same choice (the same formulas, summed in the same order;
tests/engine/test_spec_policy.py compares the two) at a few microseconds.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

SCALAR_MAX_REQUESTS = 8


def uniform_depth(alphas: Sequence[float], caps: Sequence[int], n: int, draft_s: float, bar: float,
                  graph_q: Callable[[int, int], int], cost: Callable[[int], float]) -> int:
    """Graph steps: the common depth d whose expected tokens per second beat `bar` most (0: none does)."""
    expected = [0.0] * max(caps)  # [d - 1]: accepted drafts expected at depth d, summed over the requests
    for alpha, cap in zip(alphas, caps):
        total = 0.0
        for d in range(1, len(expected) + 1):
            if d <= cap:
                total += alpha ** d
            expected[d - 1] += total
    best, best_d = bar, 0
    for d in range(1, len(expected) + 1):
        q = graph_q(n, 1 + d)
        if not q:
            break
        tps = (n + expected[d - 1]) / (cost(n * q) + draft_s * len(caps))
        if tps > best:
            best, best_d = tps, d
    return best_d


def greedy_limits(alphas: Sequence[float], caps: Sequence[int], n: int, base: int, draft_s: float, bar: float,
                  cost: Callable[[int], float]) -> list[int]:
    """Eager steps: drafts ranked by marginal gain alpha_i^j (ties: the earlier depth, then the earlier
    request), the best prefix of the ranking taken; all 0 unless it beats `bar`."""
    ranked = sorted((-(alpha ** (j + 1)), j, r) for r, (alpha, cap) in enumerate(zip(alphas, caps))
                    for j in range(cap))
    gained, firsts, best, best_m = 0.0, 0, float("-inf"), -1
    for m, (neg_gain, j, _) in enumerate(ranked):
        gained -= neg_gain
        firsts += j == 0
        tps = (n + gained) / (cost(base + m + 1) + draft_s * firsts)
        if tps > best:
            best, best_m = tps, m
    limits = [0] * len(caps)
    if best > bar:
        for _, _, r in ranked[:best_m + 1]:
            limits[r] += 1
    return limits
