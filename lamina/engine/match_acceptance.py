"""MatchAcceptance: how often an n-gram draft is accepted, by the length of the match it continues (issue #12).

A prompt-lookup draft (lamina/spec/ngram.py) copies what followed an earlier occurrence of the request's last n
tokens. Whether the model repeats it depends on n far more than on the request (scripts/ngram_match_stats.py on
the demo model's own text, 256 tokens a prompt: the first draft of a 1-token match is accepted 33-44 % of the
time, of a match of 5 or more 87-98 %), and every accepted draft makes the match one token longer:

    P(drafts 0..j of a match of n accepted) = a(n) * a(n + 1) * ... * a(n + j)      a(m) = a(MAX_MATCH), m > MAX_MATCH

a(m) is pooled over every request from the verify steps (a draft tried at match length m, accepted or not; the
drafts after a rejection were never tried), decayed by `decay` a step, with `prior_weight` pseudo-trials at
a(m + 1) (a(MAX_MATCH)'s at `prior`). A per-request rate (SpecPolicy.alpha) would average a request's long and
short matches into one number and stay low after one unlucky verify; this one judges each match by what matches
of its length did.
"""
from __future__ import annotations

MAX_MATCH = 8


class MatchAcceptance:
    def __init__(self, prior: float = 0.5, prior_weight: float = 2.0, decay: float = 0.98) -> None:
        self.prior, self.prior_weight, self.decay = prior, prior_weight, decay
        self._counts = [[0.0, 0.0, 0] for _ in range(MAX_MATCH + 1)]  # [m]: accepted, trials, step last updated
        self._rates: list[float] | None = None  # rates(step), cached for one step
        self._rates_step = -1

    def rate(self, match: int, step: int) -> float:
        """a(match): the chance a draft continuing a match of `match` tokens is accepted."""
        return self.rates(step)[min(max(match, 1), MAX_MATCH)]

    def rates(self, step: int) -> list[float]:
        """[m]: a(m) for m in 1 .. MAX_MATCH ([0] unused). Each length's pseudo-trials sit at the rate of the
        length above it (a(MAX_MATCH)'s at `prior`): a length seldom tried is judged like its longer neighbour, so
        it is tried (optimism while unmeasured) and then measured."""
        if self._rates is not None and self._rates_step == step:
            return self._rates
        out, above = [0.0] * (MAX_MATCH + 1), self.prior
        for m in range(MAX_MATCH, 0, -1):
            accepted, trials, last = self._counts[m]
            factor = self.decay ** (step - last)
            out[m] = above = (accepted * factor + self.prior_weight * above) / (trials * factor + self.prior_weight)
        self._rates, self._rates_step = out, step
        return out

    def chain(self, match: int, cap: int, step: int) -> list[float]:
        """[j]: the chance that drafts 0..j are all accepted, for j < cap."""
        rates, out, p = self.rates(step), [], 1.0
        for j in range(cap):
            p *= rates[min(match + j, MAX_MATCH)]
            out.append(p)
        return out

    def observe(self, match: int, drafted: int, accepted: int, step: int) -> None:
        """A verify of `drafted` drafts of a match of `match` tokens, of which the first `accepted` were kept."""
        self._rates = None
        for j in range(min(accepted + 1, drafted)):
            row = self._counts[min(match + j, MAX_MATCH)]
            factor = self.decay ** (step - row[2])
            row[0], row[1], row[2] = row[0] * factor + (j < accepted), row[1] * factor + 1, step
