"""Adaptive speculation (engine/spec_policy.py): drafts only where they raise the step's expected tokens/s, from
synthetic cost curves and acceptance rates; the wiring in propose_drafts. The cost model alone: test_step_cost.py."""
from __future__ import annotations

import numpy as np
import pytest

from lamina.engine import drafts
from lamina.engine.request import Request
from lamina.engine.spec_policy import SpecPolicy, expected_accepted
from lamina.engine.spec_policy_scalar import SCALAR_MAX_REQUESTS
from lamina.engine.step_cost import StepCostModel
from lamina.sampling_params import SamplingParams
from lamina.spec.ngram import NgramProposer
from tests.engine.test_step_cost import Clock

GRAPHS = {"graph_query_lens": (1, 4), "graph_max_rows": 256}  # decode and k = 3 verify graphs, as the worker


class Exact:
    """A cost model that knows the curve (to test the choice alone)."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def cost(self, tokens):
        return self.fn(np.asarray(tokens, dtype=np.float64))


def policy_for(fn, alphas: list[float], exact: bool = True, **kwargs) -> tuple[SpecPolicy, list[str]]:
    """A policy whose cost is `fn` and whose request i has seen 200 drafts accepted at rate alphas[i]."""
    if exact:
        cost = Exact(fn)
    else:
        cost = StepCostModel()
        cost.seed((t, float(fn(t))) for t in range(1, 4097))
    policy = SpecPolicy(cost=cost, **kwargs)
    ids = [f"r{i}" for i in range(len(alphas))]
    hits = np.round(200 * np.asarray(alphas))
    for j in range(200):
        policy.observe_verifies(ids, [1] * len(ids), (j < hits).astype(int))
    return policy, ids


def flat(t):  # batch-1 GPU: memory bound, cost(1) ~ cost(8)
    return 0.010 + 1e-7 * t


def linear(t):  # compute bound: every token costs the same
    return 1e-4 * t


def expected_tps(policy: SpecPolicy, ids: list[str], limits: list[int], base: int | None = None,
                 tokens: int | None = None) -> float:
    n = len(ids)
    gain = sum(expected_accepted(policy.alpha(r), k) for r, k in zip(ids, limits))
    tokens = (base or n) + sum(limits) if tokens is None else tokens
    return (n + gain) / float(policy.cost.cost(tokens))


def test_expected_accepted_is_the_truncated_geometric_sum() -> None:
    assert expected_accepted(0.5, 0) == 0
    assert expected_accepted(0.5, 3) == pytest.approx(0.5 + 0.25 + 0.125)
    assert expected_accepted(1.0, 4) == 4


def test_flat_cost_gives_full_drafts() -> None:
    for alphas in ([0.6], [0.6] * 8):
        policy, ids = policy_for(flat, alphas)
        assert policy.draft_limits(ids, [3] * len(ids)) == [3] * len(ids)
        assert policy.draft_limits(ids, [2] + [5] * (len(ids) - 1)) == [2] + [5] * (len(ids) - 1)  # caps hold


def test_linear_cost_gives_no_drafts() -> None:
    for alpha in (0.6, 0.9):
        policy, ids = policy_for(linear, [alpha] * 64)
        assert policy.draft_limits(ids, [3] * 64) == [0] * 64


def test_low_acceptance_gives_no_drafts() -> None:
    def affine(t):
        return 0.010 + 1e-4 * t  # 8 drafts cost 7 %; at alpha 0.05 they return 5 % more tokens
    policy, ids = policy_for(affine, [0.05] * 8)
    assert policy.draft_limits(ids, [3] * 8) == [0] * 8
    policy, ids = policy_for(affine, [0.6] * 8)
    assert policy.draft_limits(ids, [3] * 8) == [3] * 8


def test_high_acceptance_requests_draft_first() -> None:
    def affine(t):
        return 0.010 + 1e-4 * t  # a draft pays when its gain alpha^j is above ~0.14
    policy, ids = policy_for(affine, [0.1, 0.9, 0.3, 0.9] * 4)
    assert policy.draft_limits(ids, [3] * 16) == [0, 3, 1, 3] * 4


def test_no_eligible_request_and_empty_batch() -> None:
    policy, ids = policy_for(flat, [0.9] * 3)
    assert policy.draft_limits(ids, [0, 0, 0]) == [0, 0, 0]
    assert policy.draft_limits([], []) == []


@pytest.mark.parametrize("seed", range(4))
def test_never_slower_than_no_drafts_in_expectation(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(50):
        n = int(rng.integers(1, 257))
        a, b, p = rng.uniform(1e-3, 2e-2), rng.uniform(0, 1e-4), rng.uniform(0.3, 1.5)
        hinge = rng.uniform(1, 1024)

        def curve(t, a=a, b=b, p=p, hinge=hinge):
            return a + b * np.maximum(t - hinge, 0) ** p + 1e-7 * t
        policy, ids = policy_for(curve, list(rng.beta(2, 2, n)))
        caps = list(rng.integers(0, 8, n))
        base = n + int(rng.integers(0, 2)) * int(rng.integers(0, 4096))  # sometimes a prefill chunk
        limits = policy.draft_limits(ids, caps, base)
        assert all(0 <= k <= c for k, c in zip(limits, caps))
        assert expected_tps(policy, ids, limits, base) >= expected_tps(policy, ids, [0] * n, base)


def test_never_slower_with_a_learned_cost_model() -> None:
    rng = np.random.default_rng(7)
    for _ in range(10):
        hinge, slope = rng.uniform(16, 512), rng.uniform(1e-6, 1e-4)

        def curve(t, hinge=hinge, slope=slope):
            return 0.008 + slope * np.maximum(np.asarray(t, dtype=np.float64) - hinge, 0)
        n = int(rng.integers(1, 257))
        policy, ids = policy_for(curve, list(rng.beta(2, 2, n)), exact=False)
        limits = policy.draft_limits(ids, [3] * n)
        truth = Exact(curve)
        gain = sum(expected_accepted(policy.alpha(r), k) for r, k in zip(ids, limits))
        spec, plain = (n + gain) / truth.cost(n + sum(limits)), n / truth.cost(n)
        assert spec >= plain


def test_graph_steps_draft_all_or_nothing() -> None:
    policy, ids = policy_for(flat, [0.6] * 8, **GRAPHS)
    assert policy.draft_limits(ids, [3, 3, 0, 2, 3, 3, 3, 3]) == [3, 3, 0, 2, 3, 3, 3, 3]
    policy, ids = policy_for(linear, [0.9] * 8, **GRAPHS)
    assert policy.draft_limits(ids, [3] * 8) == [0] * 8


def test_step_tokens_count_graph_padding() -> None:
    policy = SpecPolicy(**GRAPHS)
    assert policy.step_tokens([1, 1, 1]) == 3
    assert policy.step_tokens([1, 2, 4]) == 12  # one verify graph of q = 4 for three rows
    assert policy.step_tokens([1, 20]) == 21  # a prompt chunk: eager
    assert policy.step_tokens([1] * 300) == 300  # beyond the largest graph: eager
    assert SpecPolicy().step_tokens([1, 2, 4]) == 7


def test_a_policy_drafts_again_once_a_dear_verify_cost_has_gone_stale() -> None:
    clock = Clock()
    policy = SpecPolicy(cost=StepCostModel(max_age=4.0, clock=clock), **GRAPHS)
    ids = ["r0"]
    for _ in range(20):  # every draft accepted so far
        policy.observe_verifies(ids, [3], [3])
    for _ in range(3):
        policy.observe_step(4, 0.0021)
        policy.observe_step(1, 0.00047)
    assert policy.draft_limits(ids, [3]) == [0]  # 4 tokens in 4.5 plain steps: not even certain drafts pay
    for _ in range(50):  # 5 s of plain steps
        clock.now += 0.1
        policy.observe_step(1, 0.00047)
    assert policy.draft_limits(ids, [3]) == [3]


def test_cold_start_measures_then_decides() -> None:
    policy, ids = SpecPolicy(), [f"r{i}" for i in range(4)]
    assert policy.draft_limits(ids, [3] * 4) == [3] * 4  # prior 0.5, nothing measured
    policy.observe_step(16, 0.016)  # the verify step: 16 tokens, compute bound
    assert policy.draft_limits(ids, [3] * 4) == [0] * 4
    policy.observe_step(4, 0.004)  # the plain step confirms it
    assert policy.draft_limits(ids, [3] * 4) == [0] * 4
    gpu = SpecPolicy()
    gpu.observe_step(16, 0.010)
    gpu.observe_step(4, 0.0099)
    assert gpu.draft_limits(ids, [3] * 4) == [3] * 4


def test_prompt_steps_are_not_measured() -> None:
    policy = SpecPolicy()
    policy.observe_step(2048, 0.5, has_prompt=True)
    assert len(policy.cost.points()[0]) == 0


def decoding(request_id: str, tokens: list[int]) -> Request:
    request = Request(request_id, tokens[:2], SamplingParams(max_tokens=1000))
    request.append_output_token_ids(tokens[2:])
    request.num_computed_tokens = request.num_tokens - 1
    return request


def test_acceptance_from_request_counters_and_decay_to_the_prior() -> None:
    """A request that drafts in vain stops; its estimate returns to the prior (the engine-wide rate, itself returning
    to prior_alpha over thousands of steps) and it drafts again; a request gone is forgotten."""
    policy = SpecPolicy(cost=Exact(lambda t: 0.010 + 2e-5 * t))
    request = decoding("a", [1, 2, 3, 4])
    policy.observe_requests([request])
    for _ in range(100):  # every verify: 3 drafts, none accepted
        request.metrics.num_draft_tokens += 3
        policy.observe_requests([request])
    assert policy.alpha("a") < 0.05 and policy.draft_limits(["a"], [3]) == [0]
    for _ in range(300):  # no drafts: the request's evidence fades toward the engine-wide rate, as low
        policy.observe_requests([request])
    assert policy.alpha("a") < 0.1
    for _ in range(3000):  # which itself fades toward prior_alpha, slower: then it is tried again
        policy.observe_requests([request])
    assert policy.alpha("a") > 0.3 and policy.draft_limits(["a"], [3]) == [3]
    policy.observe_requests([])
    assert policy.alpha("a") == policy.prior()  # forgotten


def test_one_unlucky_verify_is_tried_again_within_tens_of_steps() -> None:
    """A request whose first three drafts were rejected falls well below the drafter's engine-wide rate and, with a
    verify step at 2.6 plain steps (the cost curve: docs/BENCHMARKS.md, thirty-first session), stops drafting. Its
    evidence ages with each step without drafts (`tick`) back toward the engine-wide rate, which is remembered
    longer, so it drafts again within tens of steps; the engine-wide rate itself returns to prior_alpha only over
    thousands. (Regression: both aged alike, and such a request never drafted again.)"""
    policy = SpecPolicy(cost=Exact(lambda t: np.where(t <= 1, 0.73e-3, 1.93e-3)), **GRAPHS)
    earlier = decoding("a", [1, 2, 3, 4])
    policy.observe_requests([earlier])
    for _ in range(40):  # the earlier requests' verifies: every draft accepted
        earlier.metrics.num_draft_tokens += 3
        earlier.metrics.num_accepted_tokens += 3
        policy.observe_requests([earlier])
    unlucky = decoding("b", [5, 6, 7])
    policy.observe_requests([unlucky])
    assert policy.draft_limits(["b"], [3]) == [3]  # the engine-wide rate: worth drafting
    unlucky.metrics.num_draft_tokens += 3  # none accepted
    policy.observe_requests([unlucky])
    assert policy.alpha("b") < 0.7 and policy.draft_limits(["b"], [3]) == [0]
    ticks = 0
    while policy.draft_limits(["b"], [3]) == [0]:
        policy.tick()
        ticks += 1
    assert 10 <= ticks <= 60 and policy.prior() > 0.9, (ticks, policy.prior())
    for _ in range(3000):
        policy.tick()
    assert abs(policy.prior() - policy.prior_alpha) < 0.05


def test_a_reused_request_id_starts_from_the_prior() -> None:
    """A new request under an id that finished during a pause: neither the old estimate nor the old counters."""
    policy = SpecPolicy(cost=Exact(lambda t: 0.010 + 2e-5 * t))
    old = decoding("a", [1, 2, 3, 4])
    policy.observe_requests([old])
    for _ in range(50):
        old.metrics.num_draft_tokens += 3
        policy.observe_requests([old])
    assert policy.alpha("a") < 0.1
    new = decoding("a", [5, 6, 7])
    policy.observe_requests([new])
    assert policy.alpha("a") == policy.prior()
    new.metrics.num_draft_tokens, new.metrics.num_accepted_tokens = 3, 3  # its first verify is read
    policy.observe_requests([new])
    assert policy.alpha("a") > policy.prior()


def test_new_requests_start_from_the_engine_wide_rate() -> None:
    policy, _ = policy_for(flat, [0.9] * 4)
    assert policy.alpha("new") == policy.prior() > 0.85


def test_propose_drafts_follows_the_policy() -> None:
    requests = [decoding(f"r{i}", [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]) for i in range(4)]
    arrays, stats = drafts.TokenArrays(), drafts.SpecDecodeStats()
    off = SpecPolicy(cost=Exact(linear))
    drafts.propose_drafts(NgramProposer(3), requests, 3, 100, arrays, off, stats)
    assert all(r.spec_token_ids == [] for r in requests)
    assert (stats.policy_steps, stats.policy_off_steps, stats.mean_draft_limit) == (1, 1, 0.0)
    on = SpecPolicy(cost=Exact(flat))
    drafts.propose_drafts(NgramProposer(3), requests, 3, 100, arrays, on, stats)
    assert all(r.spec_token_ids == [7, 8, 5] for r in requests)
    assert (stats.policy_steps, stats.policy_off_steps, stats.mean_draft_limit) == (2, 1, 1.5)


class OneMatch:
    """A proposer that finds drafts for the first request only."""

    def propose(self, token_ids, max_drafts):
        return [[9] * m if i == 0 else [] for i, m in enumerate(max_drafts)]


def test_drafts_that_no_longer_pay_after_proposing_are_dropped() -> None:
    requests = [decoding(f"r{i}", [1, 2, 3, 4]) for i in range(8)]
    policy = SpecPolicy(cost=Exact(lambda t: np.where(t > 8, 0.012, 0.010)), **GRAPHS)
    assert policy.draft_limits([r.request_id for r in requests], [3] * 8) == [3] * 8  # all 8 would pay
    stats = drafts.SpecDecodeStats()
    drafts.propose_drafts(OneMatch(), requests, 3, 100, drafts.TokenArrays(), policy, stats)
    assert all(r.spec_token_ids == [] for r in requests)  # one alone does not pay for padding 8 rows to 4
    assert (stats.policy_cut_tokens, stats.policy_off_steps) == (3, 1)


def test_draft_limits_is_cheap_at_256_requests() -> None:
    import time
    policy, ids = policy_for(lambda t: 0.01 + 1e-5 * t, list(np.linspace(0.05, 0.95, 256)))
    start = time.perf_counter()
    for _ in range(20):
        policy.draft_limits(ids, [7] * 256)
    assert (time.perf_counter() - start) / 20 < 0.005


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_scalar_path_chooses_as_the_numpy_path(graphs: bool) -> None:
    """Up to SCALAR_MAX_REQUESTS requests draft_limits runs in plain Python (spec_policy_scalar.py); on random
    acceptance histories, cost curves, caps and step sizes it makes the numpy path's choice every time."""
    rng = np.random.default_rng(0)
    differ, drafting = 0, 0
    for trial in range(400):
        policy = SpecPolicy(graph_query_lens=(1, 4, 8) if graphs else (), graph_max_rows=64 if graphs else 0)
        per_token = rng.uniform(1e-6, 4e-5)
        for t in rng.integers(1, 400, size=int(rng.integers(0, 12))):
            policy.observe_step(int(t), 3e-4 + per_token * int(t) * rng.lognormal(0, 0.2))
        n = int(rng.integers(1, SCALAR_MAX_REQUESTS + 1))
        ids = [f"t{trial}r{i}" for i in range(n)]
        for _ in range(int(rng.integers(0, 6))):
            drafted = rng.integers(0, 4, size=n)
            policy.observe_verifies(ids, drafted.tolist(), rng.integers(0, 4, size=n).tolist())
            policy.steps += int(rng.integers(0, 3))
        caps = rng.integers(0, 8, size=n).tolist()
        if not any(caps):
            continue
        base = n if graphs and rng.random() < 0.7 else n + int(rng.integers(0, 64))
        draft_s = float(rng.choice([0.0, 1e-5, 1e-4]))
        bar = (1 + policy.min_gain) * n / float(policy.cost.cost(base))
        eligible = [i for i, c in enumerate(caps) if c]
        matches = rng.integers(1, 9, size=len(eligible)).tolist() if trial % 2 else None
        for m in matches or []:
            policy.matches.observe(m, int(rng.integers(1, 8)), int(rng.integers(0, 8)), policy.steps)
        sub_ids, sub_caps = [ids[i] for i in eligible], np.asarray([caps[i] for i in eligible])
        fast = policy._limits_scalar(policy.chains(sub_ids, sub_caps.tolist(), matches), n, base, draft_s, bar)
        slow = policy._limits_numpy(policy.gains(sub_ids, sub_caps, matches), sub_caps, n, base, draft_s, bar)
        differ += fast != slow
        drafting += any(slow)
        assert policy.alphas(ids).tolist() == pytest.approx([policy.alpha(r) for r in ids], rel=1e-12)
    assert differ == 0 and drafting > 50  # and the cases are not all "no drafts"
