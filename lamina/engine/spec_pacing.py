"""How often the speculator decides: the policy's pauses (Rest) and a request's guesses (GuessRate).

    Rest, after steps where the policy let nobody draft (d: a decision, .: a step without one)
        nothing could pay:        d . d . . d . . . . d ...   1, 2, 4 ... MAX_REST steps, reset by a draft
        no match worth drafting:  d . d . . d . . d . .  ...   at most MATCH_MAX_REST, longer only where the
                                                              decisions' host time would pass DECISION_BUDGET
    GuessRate, per request (guess_ahead): guesses while GUESS_MIN_HELD of them hold, then one probe in 1, 2, 4 ...

Both are plain state machines over what the Speculator (lamina/engine/speculator.py) tells them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from lamina.engine.drafts import Verdict


MAX_REST = 32  # steps: the longest pause of the policy's decisions while speculation does not pay
# n-gram pauses after a step without a match worth drafting (a step where drafts could pay), which is often followed
# by one with a match (a repeat with a gap): for 1 or 2 steps, so a repeat goes unnoticed for at most 2 (a decision
# at batch 1 costs one synchronous step instead of one launched ahead)
MATCH_MAX_REST = 2
# ... unless deciding costs more: consecutive steps without a match worth drafting pause longer, up to as many steps
# as keep the host time of the decisions that let nobody draft under this share of the steps' time (at 32-256 rows
# of the demo model on the H200 a 5 % share, and pauses of up to 2 steps, lost to off: docs/BENCHMARKS.md, tenth
# session)
DECISION_BUDGET = 0.02
HIT_DECAY = 0.9  # the hit rate (decisions that let some request draft) is an EMA over decisions with this decay
# guesses (guess_ahead) pay while at least this share of them holds: a step launched on a guess that held saves less
# than one whose guess failed costs (its launch, then the void step's device time), so they break even at about two
# thirds held, and measured rates near that gained nothing (docs/speculative.md, "Steps launched on a guess"); a
# request guesses only while its rate is well above that: after a failure it waits for a probe that holds
GUESS_MIN_HELD = 0.75
GUESS_DECAY = 0.7  # a request's guess rate is an EMA over its guesses with this decay (a failure pauses it)


@dataclass
class GuessRate:
    """How often one request's guesses held (an EMA; it starts at 1: a request guesses until they fail). Below
    GUESS_MIN_HELD it makes none, but for one in `every` chances (a probe), `every` doubling up to MAX_REST while
    the rate stays low. How often guesses hold depends on the text, so each request has its own."""

    held: float = 1.0
    every: int = 1
    skipped: int = 0

    def wants(self) -> bool:
        if self.held >= GUESS_MIN_HELD:
            return True
        self.skipped += 1
        if self.skipped < self.every:
            return False
        self.skipped = 0
        return True

    def observe(self, held: bool) -> None:
        self.held = GUESS_DECAY * self.held + (1 - GUESS_DECAY) * held
        self.every = 1 if self.held >= GUESS_MIN_HELD else min(2 * self.every, MAX_REST)


@dataclass
class Rest:
    """After a step for which the policy let nobody draft, the next 1, 2, 4, ... MAX_REST steps make no decision
    at all (no proposal, no policy work) and may be launched ahead (async scheduling), so that speculation which
    does not pay costs next to nothing; a step with drafts resets the pause to 1. A worker-side proposer's step
    counts as drafting when the policy allowed drafts, whether the proposer found any or not. n-gram's step
    without a match worth drafting (Verdict.NOTHING_FOUND) pauses for at most MATCH_MAX_REST steps (a repeat
    often resumes after a gap, and longer pauses missed it: docs/speculative.md, "Adaptive speculation"), or longer
    where decisions that find nothing cost a large share of the steps:

        a decision of `decision_share` of a step (its host time over the step's) finds drafts with probability h
        (hit_rate); one decision per pause of L steps wastes decision_share * (1 - h) / (L + 1) of the time,
        so L = ceil(decision_share * (1 - h) / DECISION_BUDGET) - 1 keeps that under DECISION_BUDGET."""

    left: int = 0
    length: int = 1
    hit_rate: float = 0.5

    def resting(self) -> bool:
        if self.left:
            self.left -= 1
            return True
        return False

    def decided(self, verdict: Verdict, decision_share: float = 0.0) -> None:
        self.hit_rate = HIT_DECAY * self.hit_rate + (1 - HIT_DECAY) * (verdict is Verdict.DRAFTING)
        if verdict is Verdict.DRAFTING:
            self.length = 1
        elif verdict is Verdict.NOTHING_FOUND:
            longest = self._longest(decision_share, self.hit_rate)
            self.left, self.length = min(self.length, longest), min(2 * self.length, longest)
        else:
            self.left, self.length = self.length, min(2 * self.length, MAX_REST)

    def if_nothing_drafted(self, decision_share: float) -> int:
        """The pause that a decision letting nobody draft (though drafts could pay) would start: the steps the
        next decision is put off by, which the policy weighs (SpecPolicy.draft_limits's decline_pause)."""
        return min(self.length, self._longest(decision_share, HIT_DECAY * self.hit_rate))

    def _longest(self, decision_share: float, hit_rate: float) -> int:
        wasted = decision_share * (1 - hit_rate)
        return min(MAX_REST, max(MATCH_MAX_REST, math.ceil(wasted / DECISION_BUDGET) - 1))
