"""The speculator's pacing (lamina/engine/spec_pacing.py): how long the policy's decisions pause."""
from __future__ import annotations

from lamina.engine.drafts import Verdict
from lamina.engine.spec_pacing import DECISION_BUDGET, MATCH_MAX_REST, MAX_REST, Rest


def rest_pattern(steps: int, verdict_at, decision_share: float = 0.0) -> str:  # noqa: ANN001 - step -> Verdict
    """'d' for each step that decides (with verdict_at(step)), '.' for each step of a pause."""
    rest, pattern = Rest(), []
    for step in range(steps):
        if rest.resting():
            pattern.append(".")
            continue
        pattern.append("d")
        rest.decided(verdict_at(step), decision_share)
    return "".join(pattern)


def test_rest_doubles_while_nobody_drafts_and_resets_on_drafts() -> None:
    text = rest_pattern(40, lambda step: Verdict.OFF)
    assert text.startswith("d.d..d....d........d")  # pauses of 1, 2, 4, 8, 16 steps
    assert max(map(len, text.split("d"))) <= MAX_REST
    rest = Rest(left=0, length=8)
    rest.decided(Verdict.DRAFTING)
    assert (rest.left, rest.length) == (0, 1)


def test_a_step_without_a_match_worth_drafting_pauses_briefly() -> None:
    """n-gram: where drafts could pay but none was found, the pause stays at most MATCH_MAX_REST steps, also after
    a long pause of steps where drafts could not pay."""
    text = rest_pattern(30, lambda step: Verdict.OFF if step < 10 else Verdict.NOTHING_FOUND)
    assert text[:10] == "d.d..d...." and text[10:].startswith("d..d..d..") and MATCH_MAX_REST == 2


def test_decisions_that_cost_a_large_share_of_a_step_pause_longer() -> None:
    """A decision costing 30 % of a step that never finds drafts: pauses of 1, 2, 4, 8, then longer as its hit rate
    falls from the prior 0.5, up to 0.30 / DECISION_BUDGET - 1 = 14 steps, where the decisions cost DECISION_BUDGET
    of the steps' time; a decision costing a share of DECISION_BUDGET pauses as before (MATCH_MAX_REST); a step with
    drafts resets the pause."""
    assert DECISION_BUDGET == 0.02
    text = rest_pattern(300, lambda step: Verdict.NOTHING_FOUND, decision_share=0.3)
    pauses = [len(pause) for pause in text.split("d")[1:-1]]
    assert pauses[:5] == [1, 2, 4, 8, 10] and pauses == sorted(pauses) and pauses[-1] == 14
    assert rest_pattern(12, lambda step: Verdict.NOTHING_FOUND, DECISION_BUDGET) == "d.d..d..d..d"
    text = rest_pattern(24, lambda step: Verdict.DRAFTING if step == 10 else Verdict.NOTHING_FOUND, 0.3)
    assert text.startswith("d.d..d....dd.d..d....d")


def verdict_pattern(verdicts: list[Verdict], decision_share: float, rest: Rest) -> str:
    """rest_pattern for the given verdicts, one a decision."""
    pending, pattern = iter(verdicts), []
    for verdict in pending:
        while rest.resting():
            pattern.append(".")
        pattern.append("d")
        rest.decided(verdict, decision_share)
    return "".join(pattern)


def test_decisions_that_often_find_drafts_pause_briefly() -> None:
    """The pause is for decisions that find nothing: where 3 of 4 decisions let some request draft, a decision
    costing 15 % of a step pauses at most MATCH_MAX_REST steps after steps without a match; where none does, the
    third step without a match pauses 4 steps."""
    often = verdict_pattern(([Verdict.DRAFTING] * 9 + [Verdict.NOTHING_FOUND] * 3) * 10, 0.15, Rest(hit_rate=0.75))
    assert "ddd.d..d..ddd" in often and max(map(len, often.split("d"))) == MATCH_MAX_REST
    assert verdict_pattern([Verdict.NOTHING_FOUND] * 4, 0.15, Rest(hit_rate=0.0)) == "d.d..d....d"


def test_the_pause_a_decision_would_start_is_the_one_it_starts() -> None:
    """if_nothing_drafted (what the policy weighs: SpecPolicy.draft_limits's decline_pause) tells the pause that a
    decision finding nothing starts, at every point of a run of such decisions."""
    for share, hit_rate in ((0.15, 0.75), (0.15, 0.0), (0.6, 0.2), (0.01, 0.9)):
        rest = Rest(hit_rate=hit_rate)
        for _ in range(8):
            said = rest.if_nothing_drafted(share)
            rest.decided(Verdict.NOTHING_FOUND, share)
            assert rest.left == said
            while rest.resting():
                pass
