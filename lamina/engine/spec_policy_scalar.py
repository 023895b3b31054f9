"""SpecPolicy's choice of drafts for a few requests, in plain Python (issue #12).

The numpy path of lamina/engine/spec_policy.py spends ~20 array operations on a call whatever the batch, about
0.1 ms on a 2-core host: the size of a whole demo-model step on the H200, paid twice a step at batch 1. Up to
SCALAR_MAX_REQUESTS requests these functions make the same choice (the same formulas, summed in the same order;
tests/engine/test_spec_policy.py compares the two) at a few microseconds.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

SCALAR_MAX_REQUESTS = 8


def uniform_depth(chains: Sequence[Sequence[float]], n: int, draft_s: float, bar: float,
                  graph_q: Callable[[int, int], int], cost: Callable[[int], float]) -> int:
    """Graph steps: the common depth d whose expected tokens per second beat `bar` most (0: none does).
    chains[i][j]: the chance that request i's drafts 0..j are accepted (len(chains[i]) is its cap)."""
    expected = [0.0] * max(len(c) for c in chains)  # [d - 1]: accepted drafts expected at depth d, summed
    for chain in chains:
        total = 0.0
        for d in range(1, len(expected) + 1):
            if d <= len(chain):
                total += chain[d - 1]
            expected[d - 1] += total
    best, best_d = bar, 0
    costs: dict[int, float] = {}  # q -> the step's cost: depths padded to one captured q cost the same
    for d in range(1, len(expected) + 1):
        q = graph_q(n, 1 + d)
        if not q:
            break
        if q not in costs:
            costs[q] = cost(n * q)
        tps = (n + expected[d - 1]) / (costs[q] + draft_s * len(chains))
        if tps > best:
            best, best_d = tps, d
    return best_d


def greedy_limits(chains: Sequence[Sequence[float]], n: int, base: int, draft_s: float, bar: float,
                  cost: Callable[[int], float]) -> list[int]:
    """Eager steps: drafts ranked by marginal gain chains[r][j] (ties: the earlier depth, then the earlier
    request), the best prefix of the ranking taken; all 0 unless it beats `bar`."""
    ranked = sorted((-p, j, r) for r, chain in enumerate(chains) for j, p in enumerate(chain))
    gained, firsts, best, best_m = 0.0, 0, float("-inf"), -1
    for m, (neg_gain, j, _) in enumerate(ranked):
        gained -= neg_gain
        firsts += j == 0
        tps = (n + gained) / (cost(base + m + 1) + draft_s * firsts)
        if tps > best:
            best, best_m = tps, m
    limits = [0] * len(chains)
    if best > bar:
        for _, _, r in ranked[:best_m + 1]:
            limits[r] += 1
    return limits
