"""Adaptive speculation (issue #12): how many drafts each request gets in the next step, chosen from a measured
cost model of the step and each request's running acceptance rate, so that speculating is never slower (in
expectation) than not speculating.

    expected tokens/s of a step = (n + sum_i E(alpha_i, k_i)) / (cost(T) + c_draft * #{i : k_i > 0})

    n            requests in the step (each samples one token without drafts)
    E(alpha, k)  accepted drafts out of k: p_1 + p_2 + .. + p_k, p_j the chance that drafts 1..j are all
                 accepted (`chains`): alpha^j for one running rate alpha per request, or for n-gram drafts the
                 product of their match lengths' rates (lamina/engine/match_acceptance.py)
    T            tokens the device computes: base + sum_i k_i when eager; rows * q under a CUDA graph, q being
                 the captured query length that holds 1 + max_i k_i (a graph pads every row to q)
    cost(T)      StepCostModel: measured wall time of steps without prompt tokens
    c_draft      measured host time of a decision (proposing and this policy), per request

Eager steps: the drafts are ranked by their marginal gain p_ij and the best prefix of that ranking is
taken. Graph steps: the best common depth d (every request drafts min(d, cap_i)). Either way the answer is
"no drafts" unless it beats no drafts by `min_gain`: speculation is then off for the step. No drafts runs at

    n / (cost(base) + c_draft * n / (L + 1))      L: the steps a decision is put off by when nobody drafts

(the Speculator's pause, `decline_pause`): the decision is paid either way, drafting only brings the next one
sooner. Without the second term the plain step looked 0.07 ms cheaper than it is at batch 1 on an H100 (a
decision there cost ~0.08 ms, a plain step ~0.3), and the policy declined drafts that k fixed showed to pay.

Exploration: a request's evidence decays by `decay` a step, so the estimate of a request that stopped drafting
drifts back to the prior, the engine-wide rate; the request drafts again once the prior says it pays at the step's
cost, and the new measurement decides. The engine-wide rate is the drafter's, remembered longer: it drifts back to
`prior_alpha` by `prior_decay` a step (~500 steps against a request's ~50), so that a request whose first verify
went badly is tried again within tens of steps rather than judged by a prior that has sunk with it. A step is a
call of observe_requests (n-gram: a decision) or of `tick` (the worker's proposers: each step of the gate's SPEC
arm without drafts). The cost model answers a bucket's minimum until it has `min_samples` steps, so an unlucky
slow step is measured again, and a bucket not measured for `max_age` seconds counts as unmeasured again: a verify
cost that said drafting cannot pay (the warm-up's) then looks as cheap as the fresh plain steps predict, the
policy drafts, and the new verify steps measure both the cost and the acceptance of the requests that drafted.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lamina.engine import spec_policy_scalar as scalar
from lamina.engine.match_acceptance import MAX_MATCH, MatchAcceptance
from lamina.engine.request import Request
from lamina.engine.step_cost import StepCostModel
from lamina.step import SchedulerOutput

__all__ = ["SpecPolicy", "expected_accepted"]


def expected_accepted(alpha: float, k: int) -> float:
    """E[accepted drafts] of k drafts, each accepted with probability alpha given that the ones before it were."""
    return sum(alpha ** j for j in range(1, k + 1))


class SpecPolicy:
    """How many drafts each request gets in the next step (see the module docstring). Feed it after every step:
    observe_scheduled (or observe_step), and, through propose_drafts (engine/drafts.py), observe_requests
    (acceptance, read from each request's draft counters) and observe_drafting (the decision's host time).

    graph_query_lens / graph_max_rows: the query lengths captured in CUDA graphs and the largest graph batch
    (() / 0: every step eager). max_step_tokens caps the base tokens (the scheduler's token budget).

    memo_steps > 0: an n-gram answer (matches given, or certain) for up to SCALAR_MAX_REQUESTS requests depends only
    on the caps, the matches, the base and decline_pause, besides the estimates; it is kept and given again for
    the rest of a period of memo_steps steps, the estimates' changes within it ignored. At batch 1 on an H100's host a
    decision of the policy cost ~60 us against ~28 for k fixed's lookup alone, a tenth of a step; a few hundred
    steps of a request's text ask the same few questions (a match of 1, 2, .. 8 tokens, k drafts)."""

    def __init__(self, cost: StepCostModel | None = None, graph_query_lens: Sequence[int] = (),
                 graph_max_rows: int = 0, max_step_tokens: int | None = None, prior_alpha: float = 0.5,
                 prior_weight: float = 2.0, decay: float = 0.98, min_gain: float = 0.02,
                 prior_decay: float = 0.998, memo_steps: int = 0) -> None:
        self.cost = StepCostModel() if cost is None else cost
        self.graph_query_lens, self.graph_max_rows = sorted(graph_query_lens), graph_max_rows
        # [longest row]: the captured query length that holds it (the policy asks this several times a decision)
        self._q_of = [next(q for q in self.graph_query_lens if q >= n) for n in range(max(graph_query_lens) + 1)
                      ] if graph_query_lens else []
        self.max_step_tokens = max_step_tokens
        self.prior_alpha, self.prior_weight, self.decay, self.min_gain = prior_alpha, prior_weight, decay, min_gain
        self.prior_decay = prior_decay
        self.steps = 0  # observe_requests and tick calls: the clock of the decay
        self._slot: dict[str, int] = {}  # request id -> its row of _counts
        self._counts = np.zeros((64, 3))  # row: [accepted, trials, step of the last update], decayed lazily
        self._free = list(range(63, -1, -1))
        self._global = [0.0, 0.0, 0.0]
        self._seen: dict[str, tuple[Request, int, int]] = {}  # id -> (request, draft tokens, accepted) last read
        self._draft_seconds = 0.0  # a decision's host time per request (EMA)
        self.matches = MatchAcceptance(prior_alpha, prior_weight, decay)  # n-gram drafts' acceptance by match length
        self._match: dict[str, int] = {}  # request id -> the match length of its drafts in flight (note_matches)
        self.memo_steps = memo_steps
        self._memo: dict[tuple, list[int]] = {}  # draft_limits' n-gram answers for a few requests (memo_steps)
        self._memo_epoch = -1

    def prior(self) -> float:
        """The engine-wide acceptance rate: a new request's estimate."""
        factor, weight = self.prior_decay ** (self.steps - self._global[2]), 4 * self.prior_weight
        return (self._global[0] * factor + weight * self.prior_alpha) / (self._global[1] * factor + weight)

    def alphas(self, request_ids: Sequence[str]) -> np.ndarray:
        """The requests' acceptance rates: decayed counts with `prior_weight` pseudo-trials at the prior."""
        slots = np.fromiter((self._slot.get(r, -1) for r in request_ids), np.int64, len(request_ids))
        rows = np.where(slots[:, None] >= 0, self._counts[slots], 0.0)
        factor = self.decay ** (self.steps - rows[:, 2])
        weight = self.prior_weight
        return (rows[:, 0] * factor + weight * self.prior()) / (rows[:, 1] * factor + weight)

    def alpha(self, request_id: str) -> float:
        """One request's acceptance rate (the prior when it has no verify yet): `alphas` for one, without numpy."""
        slot = self._slot.get(request_id)
        accepted, trials, last = self._counts[slot].tolist() if slot is not None else (0.0, 0.0, 0.0)
        factor = self.decay ** (self.steps - last)
        return (accepted * factor + self.prior_weight * self.prior()) / (trials * factor + self.prior_weight)

    def observe_verify(self, request_id: str, num_drafts: int, num_accepted: int) -> None:
        """One verify: see observe_verifies."""
        self.observe_verifies([request_id], [num_drafts], [num_accepted])

    def observe_verifies(self, request_ids: Sequence[str], num_drafts: Sequence[int],
                         num_accepted: Sequence[int]) -> None:
        """Verifies (one a request) of num_drafts[i] drafts that accepted the first num_accepted[i]: that many
        successes and, when one was rejected, one failure (the drafts after it were never tried)."""
        drafted = np.asarray(num_drafts, dtype=np.int64)
        accepted = np.clip(np.asarray(num_accepted, dtype=np.int64), 0, drafted)
        trials = accepted + (accepted < drafted)
        keep = drafted > 0
        slots = np.fromiter((self._slot[r] if r in self._slot else self._new_slot(r)
                             for r, k in zip(request_ids, keep) if k), np.int64)
        rows = self._counts[slots]
        factor = self.decay ** (self.steps - rows[:, 2])
        self._counts[slots, 0] = rows[:, 0] * factor + accepted[keep]
        self._counts[slots, 1] = rows[:, 1] * factor + trials[keep]
        self._counts[slots, 2] = self.steps
        factor = self.prior_decay ** (self.steps - self._global[2])
        self._global = [self._global[0] * factor + accepted[keep].sum(),
                        self._global[1] * factor + trials[keep].sum(), self.steps]

    def _new_slot(self, request_id: str) -> int:
        if not self._free:
            size = len(self._counts)
            self._counts = np.concatenate([self._counts, np.zeros((size, 3))])
            self._free = list(range(2 * size - 1, size - 1, -1))
        slot = self._slot[request_id] = self._free.pop()
        self._counts[slot] = 0.0, 0.0, self.steps
        return slot

    def tick(self) -> None:
        """A step without evidence (no verify to read): the estimates age by one step."""
        self.steps += 1

    def observe_requests(self, requests: Sequence[Request]) -> None:
        """Once a step, with the running requests: advance the clock, read each one's verify since the last
        call from its counters (a request verifies at most once a step), forget the others."""
        self.steps += 1
        seen: dict[str, tuple[Request, int, int]] = {}
        verified: tuple[list[str], list[int], list[int]] = ([], [], [])
        for request in requests:
            request_id, metrics = request.request_id, request.metrics
            drafted, accepted = metrics.num_draft_tokens, metrics.num_accepted_tokens
            seen[request_id] = (request, drafted, accepted)
            before = self._seen.get(request_id)
            if before is not None and before[0] is not request:  # the id was reused (during a pause)
                self.forget(request_id)
                before = None
            if before is not None and drafted > before[1]:
                match = self._match.pop(request_id, 0)
                if match:  # n-gram drafts: judged by their match length, not by the request's rate
                    self.matches.observe(match, drafted - before[1], accepted - before[2], self.steps)
                    continue
                for column, value in zip(verified, (request_id, drafted - before[1], accepted - before[2])):
                    column.append(value)
        self._seen = seen
        if verified[0]:
            self.observe_verifies(*verified)
        for request_id in [r for r in self._slot if r not in seen]:
            self.forget(request_id)

    def skip_verifies(self, requests: Sequence[Request]) -> None:
        """Read the requests' draft counters without learning from them: their verifies since the last call were
        not the policy's (the gate's FULL windows drafted without it)."""
        self._seen = {r.request_id: (r, r.metrics.num_draft_tokens, r.metrics.num_accepted_tokens) for r in requests}
        self._match.clear()

    def note_matches(self, request_ids: Sequence[str], matches: Sequence[int]) -> None:
        """The match lengths of the n-gram drafts just set (0: none); their verify is read by observe_requests."""
        for request_id, match in zip(request_ids, matches):
            if match:
                self._match[request_id] = match
            else:
                self._match.pop(request_id, None)

    def forget(self, request_id: str) -> None:
        """Drop a request's estimate (finished, or preempted: it starts again from the prior)."""
        slot = self._slot.pop(request_id, None)
        if slot is not None:
            self._free.append(slot)
        self._seen.pop(request_id, None)
        self._match.pop(request_id, None)

    def observe_step(self, num_tokens: int, seconds: float, has_prompt: bool = False) -> None:
        """A step's tokens (as step_tokens counts them) and wall time; steps with prompt tokens are left out."""
        if not has_prompt:
            self.cost.observe(num_tokens, seconds)

    def observe_scheduled(self, scheduled: SchedulerOutput, seconds: float) -> None:
        """observe_step for a scheduler output: its tokens as the device computes them, prompt or not."""
        counts = list(scheduled.num_scheduled_tokens.values())
        num_drafts = sum(map(len, scheduled.scheduled_spec_decode_tokens.values()))
        # a row computes at least its drafts and the token before them, so some row has prompt tokens (more than
        # that) exactly when the step has more tokens than rows and drafts: O(1) where a row's test was O(rows)
        has_prompt = sum(counts) > len(counts) + num_drafts
        self.observe_step(self.step_tokens(counts), seconds, has_prompt)

    def observe_drafting(self, num_requests: int, seconds: float) -> None:
        """A decision's host time (proposing and the policy's own work) for `num_requests` requests (c_draft: an
        EMA per request)."""
        if num_requests > 0:
            old, new = self._draft_seconds, seconds / num_requests
            self._draft_seconds = 0.9 * old + 0.1 * new if old else new

    def step_tokens(self, num_scheduled: Sequence[int]) -> int:
        """The tokens a step costs: rows * q under a CUDA graph (q holds the longest row), else their sum."""
        q = self._graph_q(len(num_scheduled), max(num_scheduled, default=0))
        return len(num_scheduled) * q if q else sum(num_scheduled)

    def _graph_q(self, rows: int, longest: int) -> int:
        """The captured query length that a graph step of `rows` rows, the longest `longest` tokens, pads to (0:
        eager)."""
        if rows > self.graph_max_rows or longest >= len(self._q_of):
            return 0
        return self._q_of[longest]

    def draft_limits(self, request_ids: Sequence[str], caps: Sequence[int], base_tokens: int | None = None,
                     drafting_cost: bool = True, matches: Sequence[int] | None = None,
                     certain: bool = False, decline_pause: int | None = None) -> list[int]:
        """Drafts for each request in [0, caps[i]] that maximise the step's expected tokens/s, all 0 unless
        that beats no drafts by min_gain. base_tokens: the step's tokens without drafts (default: one a
        request). drafting_cost=False when the drafts are proposed already (their host time is spent).
        matches: n-gram drafts, the length of the match each request's drafts continue (their acceptance is
        MatchAcceptance's, not the request's rate); certain: every draft judged accepted (whether drafts can pay
        at all at this step's cost: n-gram's question before proposing). decline_pause: the steps that letting
        nobody draft would run without a decision (the Speculator's pause; None: not known). Drafting commits
        the next step to a decision (c_draft, above); not drafting only puts it off, so each of those steps
        carries its share of a decision for the n requests: the no-drafts rate is n over cost(base) + c_draft n /
        (decline_pause + 1)."""
        n = len(request_ids)
        caps = [int(c) for c in caps]
        if not any(c > 0 for c in caps):
            return [0] * n
        key = self._memo_key(caps, base_tokens, drafting_cost, matches, certain, decline_pause)
        if key is not None and self._memo_epoch != self.steps // self.memo_steps:  # a new period: answers anew
            self._memo, self._memo_epoch = {}, self.steps // self.memo_steps
        if key is not None and key in self._memo:
            return list(self._memo[key])
        limits = self._draft_limits(request_ids, caps, base_tokens, drafting_cost, matches, certain, decline_pause)
        if key is not None:
            self._memo[key] = list(limits)
        return limits

    def _memo_key(self, caps: list[int], base_tokens: int | None, drafting_cost: bool, matches: Sequence[int] | None,
                  certain: bool, decline_pause: int | None) -> tuple | None:
        """The memo's key of an n-gram question for a few requests (None: not kept, see memo_steps)."""
        if not self.memo_steps or (matches is None and not certain) or len(caps) > scalar.SCALAR_MAX_REQUESTS:
            return None
        return (tuple(caps), None if matches is None else tuple(min(m, MAX_MATCH) for m in matches), base_tokens,
                drafting_cost, certain, decline_pause)  # matches past MAX_MATCH are judged as MAX_MATCH

    def _draft_limits(self, request_ids: Sequence[str], caps: list[int], base_tokens: int | None,
                      drafting_cost: bool, matches: Sequence[int] | None, certain: bool,
                      decline_pause: int | None) -> list[int]:
        """draft_limits, computed (caps as ints, some > 0)."""
        n = len(request_ids)
        base = n if base_tokens is None else max(int(base_tokens), n)
        base = base if self.max_step_tokens is None else max(min(base, self.max_step_tokens), 1)
        draft_s = self._draft_seconds if drafting_cost else 0.0
        plain_s = float(self.cost.cost(base))
        if decline_pause is not None:
            plain_s += self._draft_seconds * n / (decline_pause + 1)
        bar = (1 + self.min_gain) * n / plain_s
        eligible = [i for i, c in enumerate(caps) if c > 0]
        ids, sub = [request_ids[i] for i in eligible], [caps[i] for i in eligible]
        sub_matches = None if matches is None else [int(matches[i]) for i in eligible]
        if n <= scalar.SCALAR_MAX_REQUESTS:
            chosen = self._limits_scalar(self.chains(ids, sub, sub_matches, certain), n, base, draft_s, bar)
        else:
            caps_ = np.asarray(sub, dtype=np.int64)
            chosen = self._limits_numpy(self.gains(ids, caps_, sub_matches, certain), caps_, n, base, draft_s, bar)
        limits = [0] * n
        for i, k in zip(eligible, chosen):
            limits[i] = k
        return limits

    def chains(self, request_ids: Sequence[str], caps: Sequence[int], matches: Sequence[int] | None = None,
               certain: bool = False) -> list[list[float]]:
        """[i][j]: the chance that request i's drafts 0..j are all accepted, j < caps[i]: alpha_i ** (j + 1), with
        `matches` MatchAcceptance's chain of each match length, 1 when `certain`."""
        if certain:
            return [[1.0] * c for c in caps]
        if matches is not None:
            return [self.matches.chain(m, c, self.steps) for m, c in zip(matches, caps)]
        return [[a ** (j + 1) for j in range(c)] for a, c in zip((self.alpha(r) for r in request_ids), caps)]

    def gains(self, request_ids: Sequence[str], caps: np.ndarray, matches: Sequence[int] | None = None,
              certain: bool = False) -> np.ndarray:
        """`chains` as a [requests, max cap] matrix, 0 past each cap: the numpy path's form, built by array ops."""
        depth = np.arange(1, int(caps.max()) + 1)
        if certain:
            p = np.ones((len(caps), len(depth)))
        elif matches is not None:
            rates = np.asarray(self.matches.rates(self.steps))
            p = np.cumprod(rates[np.minimum(np.asarray(matches)[:, None] + depth[None, :] - 1, MAX_MATCH)], axis=1)
        else:
            p = self.alphas(request_ids)[:, None] ** depth[None, :]
        return np.where(depth[None, :] <= caps[:, None], p, 0.0)

    def _limits_scalar(self, chains: list[list[float]], n: int, base: int, draft_s: float, bar: float) -> list[int]:
        """The eligible requests' limits for a few requests, in plain Python (lamina/engine/spec_policy_scalar.py)."""
        if base == n and self._graph_q(n, 1):
            depth = scalar.uniform_depth(chains, n, draft_s, bar, self._graph_q, self.cost.cost)
            return [min(len(c), depth) for c in chains]
        return scalar.greedy_limits(chains, n, base, draft_s, bar, self.cost.cost)

    def _limits_numpy(self, gains: np.ndarray, caps: np.ndarray, n: int, base: int, draft_s: float,
                      bar: float) -> list[int]:
        """The eligible requests' limits over arrays (`gains`: [requests, max cap]): the path for many requests."""
        if base == n and self._graph_q(n, 1):
            return self._uniform(gains, caps, n, draft_s, bar).tolist()
        allowed = np.arange(1, gains.shape[1] + 1)[None, :] <= caps[:, None]
        return self._greedy(gains, allowed, n, base, draft_s, bar).tolist()

    def _uniform(self, gains: np.ndarray, caps: np.ndarray, n: int, draft_s: float, bar: float) -> np.ndarray:
        """Graph steps: every row is padded to q, so the choice is a common depth d (rows draft min(d, cap))."""
        expected = np.cumsum(gains, axis=1).sum(axis=0)  # [d - 1]: accepted drafts at depth d
        best, best_d = bar, 0
        for d in range(1, len(expected) + 1):
            q = self._graph_q(n, 1 + d)
            if not q:
                break
            tps = (n + expected[d - 1]) / (float(self.cost.cost(n * q)) + draft_s * len(caps))
            if tps > best:
                best, best_d = tps, d
        return np.minimum(caps, best_d)

    def _greedy(self, gains: np.ndarray, allowed: np.ndarray, n: int, base: int, draft_s: float,
                bar: float) -> np.ndarray:
        """Eager steps: drafts ranked by marginal gain alpha_i^j (a request's j-th after its (j-1)-th), the best
        prefix of the ranking taken."""
        rows, cols = np.nonzero(allowed)
        gain = gains[rows, cols]
        order = np.lexsort((cols, -gain))
        rows, cols, gain = rows[order], cols[order], gain[order]
        seconds = self.cost.cost(base + np.arange(1, len(gain) + 1)) + draft_s * np.cumsum(cols == 0)
        tps = (n + np.cumsum(gain)) / seconds
        best = int(np.argmax(tps))
        if tps[best] <= bar:
            return np.zeros(len(allowed), dtype=np.int64)
        return np.bincount(rows[:best + 1], minlength=len(allowed))
