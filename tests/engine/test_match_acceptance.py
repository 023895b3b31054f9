"""MatchAcceptance (engine/match_acceptance.py) and its use by the adaptive policy: n-gram drafts are judged by the
length of the match they continue, so long matches draft where short ones, or a request's unlucky last verify,
would not."""
from __future__ import annotations

import pytest

from lamina.engine import drafts
from lamina.engine.match_acceptance import MAX_MATCH, MatchAcceptance
from lamina.engine.spec_policy import SpecPolicy
from lamina.spec.ngram import NgramProposer
from tests.engine.test_spec_policy import GRAPHS, Exact, decoding


def test_a_verify_counts_its_tried_drafts_at_growing_match_lengths() -> None:
    """Each length's 2 pseudo-trials sit at the rate of the length above it (a(MAX_MATCH)'s: the prior, 0.5)."""
    acc = MatchAcceptance(prior=0.5, prior_weight=2.0, decay=1.0)
    acc.observe(2, drafted=4, accepted=2, step=0)  # drafts at match 2, 3 accepted; at 4 rejected; the 4th never tried
    a4 = 1 / 3  # 0 of 1, 2 pseudo-trials at 0.5
    a3 = (1 + 2 * a4) / 3
    a2 = (1 + 2 * a3) / 3
    assert [acc.rate(m, 0) for m in (5, 4, 3, 2, 1)] == pytest.approx([0.5, a4, a3, a2, a2])
    acc.observe(MAX_MATCH + 3, drafted=1, accepted=1, step=0)  # long matches share the last bucket
    assert acc.rate(MAX_MATCH, 0) == pytest.approx(2 / 3) and acc.rate(5, 0) == pytest.approx(2 / 3)


def test_the_chain_is_the_product_along_the_match_and_decays_to_the_prior() -> None:
    acc = MatchAcceptance(prior=0.5, prior_weight=2.0, decay=0.5)
    for _ in range(50):
        acc.observe(1, drafted=1, accepted=0, step=0)
        acc.observe(2, drafted=1, accepted=1, step=0)
    a1, a2, a3 = acc.rate(1, 0), acc.rate(2, 0), acc.rate(3, 0)
    assert acc.chain(1, 3, 0) == pytest.approx([a1, a1 * a2, a1 * a2 * a3])
    assert a1 < 0.05 and a2 > 0.95 and acc.rate(1, 40) == pytest.approx(0.5, abs=1e-3)
    assert acc.rate(3, 0) == pytest.approx(acc.rate(MAX_MATCH, 0))  # a length never tried: like the one above it


def test_long_matches_draft_and_short_ones_do_not() -> None:
    """Graph steps that cost 1.5x a plain step to verify: drafting pays only for drafts accepted ~half the time.
    Matches of 1 token were always rejected, of 6 always accepted: the request with the long match drafts, the one
    with the short match does not, whatever their own histories."""
    policy = SpecPolicy(cost=Exact(lambda t: 0.010 if t <= 2 else 0.015), **GRAPHS)
    for _ in range(40):
        policy.matches.observe(1, drafted=3, accepted=0, step=0)
        policy.matches.observe(6, drafted=3, accepted=3, step=0)
    assert policy.draft_limits(["a"], [3], matches=[6]) == [3]
    assert policy.draft_limits(["a"], [3], matches=[1]) == [0]
    assert policy.draft_limits(["a"], [3]) == [3]  # the request's own rate: the prior, 0.5


def test_propose_drafts_notes_the_matches_and_learns_from_their_verifies() -> None:
    policy = SpecPolicy(cost=Exact(lambda t: 0.010 + 1e-7 * t))
    request = decoding("r", [5, 6, 7, 8, 9, 5, 6, 7, 8])  # the suffix 5 6 7 8 matches 4 tokens back
    verdict = drafts.propose_drafts(NgramProposer(3), [request], 3, 100, drafts.TokenArrays(), policy)
    assert verdict is drafts.Verdict.DRAFTING and request.spec_token_ids == [9, 5, 6]
    request.metrics.num_draft_tokens, request.metrics.num_accepted_tokens = 3, 1  # the verify: 1 of 3 accepted
    request.spec_token_ids = []
    before = policy.matches.rate(4, policy.steps), policy.matches.rate(5, policy.steps)
    policy.observe_requests([request])
    assert policy.matches.rate(4, policy.steps) > before[0] and policy.matches.rate(5, policy.steps) < before[1]


def test_the_memo_answers_a_question_again_for_the_rest_of_its_period() -> None:
    """memo_steps = 8: an n-gram question asked again within a period of 8 steps gets the first answer, whatever
    the estimates learned since; the next period asks the estimates again. Without a memo every call does."""
    cost = Exact(lambda t: 0.010 if t <= 2 else 0.015)
    memo, fresh = SpecPolicy(cost=cost, memo_steps=8, **GRAPHS), SpecPolicy(cost=cost, **GRAPHS)
    for policy in (memo, fresh):
        for _ in range(40):
            policy.matches.observe(2, drafted=3, accepted=3, step=0)
        assert policy.draft_limits(["a"], [3], matches=[2]) == [3]
        for _ in range(400):  # matches of 2 now fail: not worth drafting
            policy.matches.observe(2, drafted=3, accepted=0, step=0)
    assert fresh.draft_limits(["a"], [3], matches=[2]) == [0]
    assert memo.draft_limits(["a"], [3], matches=[2]) == [3]  # same period: the kept answer
    assert memo.draft_limits(["b"], [3], matches=[9]) == memo.draft_limits(["b"], [3], matches=[MAX_MATCH])
    memo.steps = 8  # the next period
    assert memo.draft_limits(["a"], [3], matches=[2]) == [0]
    assert memo.draft_limits(["a"], [3]) == [3]  # a request's own rate (worker-side drafts): never kept


def test_a_decision_put_off_counts_against_the_plain_step() -> None:
    """Drafting commits the next step to a decision; not drafting puts one off by decline_pause steps, so each of
    those carries its share. A decision of 4 ms against a 10 ms plain step and a 15 ms verify: two drafts worth
    ~0.74 tokens do not pay against the plain step alone (1.74 / 19 ms < 1.02 / 10 ms) but do against one that
    carries half a decision (1.02 / 12 ms); after a long pause the share is too small to matter."""
    policy = SpecPolicy(cost=Exact(lambda t: 0.010 if t <= 2 else 0.015), **GRAPHS)
    policy.observe_drafting(1, 0.004)
    for i in range(100):
        policy.matches.observe(3, drafted=1, accepted=int(i < 60), step=0)
        policy.matches.observe(4, drafted=1, accepted=int(i < 25), step=0)
    assert sum(policy.matches.chain(3, 2, 0)) == pytest.approx(0.74, abs=0.01)
    assert policy.draft_limits(["a"], [2], matches=[3]) == [0]
    assert policy.draft_limits(["a"], [2], matches=[3], decline_pause=1) == [2]
    assert policy.draft_limits(["a"], [2], matches=[3], decline_pause=20) == [0]


def test_verifies_skipped_are_not_learned_from() -> None:
    """The verifies of the gate's FULL windows (drafted without the policy) are read past, not taken for one
    verify of the match the policy last noted."""
    policy = SpecPolicy(cost=Exact(lambda t: 0.010 + 1e-7 * t))
    request = decoding("r", [5, 6, 7, 8, 9, 5, 6, 7, 8])
    drafts.propose_drafts(NgramProposer(3), [request], 3, 100, drafts.TokenArrays(), policy)
    request.metrics.num_draft_tokens, request.metrics.num_accepted_tokens = 300, 10  # many verifies later
    table = [list(row) for row in policy.matches._counts]
    policy.skip_verifies([request])
    policy.observe_requests([request])
    assert [list(row)[:2] for row in policy.matches._counts] == [row[:2] for row in table]
    request.metrics.num_draft_tokens, request.metrics.num_accepted_tokens = 303, 10  # and one of the policy's
    policy.observe_requests([request])
    assert policy.alpha("r") < policy.prior()  # read as one verify of the request's (no match noted)
