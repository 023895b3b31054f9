"""Speculative decoding on the engine side: which requests get drafts and how many, fitting them to the step's
budget, and the bookkeeping after verification.

    token ids:  | prompt ... | outputs ... | last | d_0 .. d_{k-1} |   (drafts in request.spec_token_ids)
                                            ^ num_computed_tokens = num_tokens - 1 (only the last lacks KV)

A verify step computes the last token and the k drafts (1 + k tokens) and returns a + 1 tokens: the a drafts
accepted, then a correction (a < k) or a bonus token (a = k). The KV of the k - a rejected drafts is void:
num_computed_tokens advances by 1 + a, not 1 + k, and those slots are written again later.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from lamina.engine.request import Request
from lamina.engine.spec_policy import SpecPolicy
from lamina.spec.proposer import Proposer


def max_drafts(request: Request, k: int, max_model_len: int, ahead: int = 0) -> int:
    """How many drafts `request` may get: none when its sampling reads its own output (penalties, min_tokens);
    never so many that the tokens could pass max_tokens or max_model_len. `ahead`: tokens the request gains
    before the drafts (1 when a worker-side proposer is asked before the step whose token they follow); with
    ahead = 0, none while the request is mid-prompt."""
    params = request.sampling_params
    if (params.has_penalties or request.num_output_tokens + ahead < params.min_tokens
            or (not ahead and request.num_computed_tokens != request.num_tokens - 1)):
        return 0
    room = max_model_len - request.num_tokens - 1 - ahead
    if params.max_tokens is not None:
        room = min(room, params.max_tokens - request.num_output_tokens - 1 - ahead)
    return max(0, min(k, room))


_EMPTY = np.empty(0, dtype=np.int64)
PROPOSE_FIRST_MAX_REQUESTS = 8  # n-gram decisions for up to this many requests propose before asking the policy


class TokenArrays:
    """Each running request's token ids as a numpy array that grows with them: a proposer reads every request's
    whole sequence every step, and converting the lists each time cost ~15 ns a token (15 ms a step at 256
    requests of 2,100 tokens). Outputs only grow, except a cut after a stop string, which ends the request."""

    def __init__(self) -> None:
        self._arrays: dict[str, tuple[Request, np.ndarray, int]] = {}  # request id -> (its request, buffer, filled)

    def of(self, request: Request) -> np.ndarray:
        tokens = request.all_token_ids
        length = len(tokens)
        owner, buffer, filled = self._arrays.get(request.request_id, (request, _EMPTY, 0))
        if owner is not request or filled > length:  # a reused id, or a cut output
            filled = 0
        if length > len(buffer):
            grown = np.empty(max(2 * len(buffer), length + 64), dtype=np.int64)
            grown[:filled] = buffer[:filled]
            buffer = grown
        if length == filled + 1:  # the common case: one new token a step
            buffer[filled] = tokens[filled]
        elif length > filled:
            buffer[filled:length] = tokens[filled:]
        self._arrays[request.request_id] = (request, buffer, length)
        return buffer[:length]

    def keep_only(self, request_ids: set[str]) -> None:
        """Forget the requests not in `request_ids` (finished or preempted: a preempted one is rebuilt)."""
        for request_id in [r for r in self._arrays if r not in request_ids]:
            del self._arrays[request_id]


class Verdict(Enum):
    """What propose_drafts decided for the next step (the Speculator pauses its decisions on the last two)."""

    DRAFTING = "drafting"  # some request was allowed drafts (a proposer without matches: found or not)
    NOTHING_FOUND = "nothing_found"  # n-gram: drafts could pay, but no match found was worth drafting
    OFF = "off"  # drafts cannot pay at this step's cost


def propose_drafts(proposer: Proposer, requests: list[Request], k: int, max_model_len: int, arrays: TokenArrays,
                   policy: SpecPolicy | None = None, stats: SpecDecodeStats | None = None,
                   decline_pause: int | None = None) -> Verdict:
    """Set the drafts of every running request that may have some (spec_token_ids; [] for the others) and say
    what was decided.

    Without a `policy` each request gets up to max_drafts. With one (adaptive speculation) max_drafts is the
    hard cap: the policy first reads the verifies of the step just run, then picks each request's limit (all 0:
    speculation is off this step); after proposing it keeps only the drafts that still pay (a proposer may find
    fewer than asked). `stats` counts its choices. The caller tells the policy what the whole call cost
    (SpecPolicy.observe_drafting); decline_pause: the steps without a decision that letting nobody draft would
    start (SpecPolicy.draft_limits)."""
    caps = [max_drafts(r, k, max_model_len) for r in requests]
    limits, ids, base = caps, [r.request_id for r in requests], 0
    matching = callable(getattr(proposer, "propose_with_matches", None))  # it tells its matches (Proposer's docs)
    # n-gram: could drafts pay at all at this step's cost? Then propose, and decide on the matches found. For a few
    # requests proposing costs less than asking first (~20 us against a policy call's ~30 on the H100's host): they
    # propose up to their caps, and the question is asked only when no match was worth drafting (its answer makes
    # that Verdict.OFF or NOTHING_FOUND, as asked first: drafts judged certain are the most that can pay)
    ask_first = matching and len(requests) > PROPOSE_FIRST_MAX_REQUESTS
    if policy is not None:
        base = _base_tokens(requests)
        policy.observe_requests(requests)
        if ask_first or not matching:
            limits = policy.draft_limits(ids, caps, base, certain=matching, decline_pause=decline_pause)
    asking = [i for i, n in enumerate(limits) if n > 0]
    arrays.keep_only(set(ids))  # not only the asking: the policy switches requests on and off
    drafts, matches = _propose(proposer, [arrays.of(requests[i]) for i in asking], [limits[i] for i in asking],
                               matching)
    for request in requests:
        request.spec_token_ids = []
    for i, tokens in zip(asking, drafts):
        requests[i].spec_token_ids = list(tokens[:limits[i]])
    if policy is None:
        return Verdict.DRAFTING if asking else Verdict.OFF
    found = [len(r.spec_token_ids) for r in requests]
    kept = found
    if asking:
        request_matches = None
        if matching:
            request_matches = [0] * len(requests)
            for i, match in zip(asking, matches):
                request_matches[i] = match
        # n-gram: a verify step commits the next step to a decision too, so its host time counts (at batch 8 on
        # the H200 a decision costs ~0.3 ms against a 0.6 ms step); a worker's drafts are already paid for
        kept = policy.draft_limits(ids, found, base, drafting_cost=matching, matches=request_matches,
                                   decline_pause=decline_pause)
        for request, keep, num in zip(requests, kept, found):
            if keep < num:
                request.spec_token_ids = request.spec_token_ids[:keep]
        if request_matches is not None:
            policy.note_matches(ids, [m if keep else 0 for m, keep in zip(request_matches, kept)])
        if matching and not ask_first and not any(kept):
            limits = policy.draft_limits(ids, caps, base, certain=True, decline_pause=decline_pause)
            asking = [i for i, n in enumerate(limits) if n > 0]
    if stats is not None:
        stats.record_policy(caps, limits, found, kept)
    if not asking:
        return Verdict.OFF
    return Verdict.NOTHING_FOUND if matching and not any(kept) else Verdict.DRAFTING


def _propose(proposer: Proposer, token_ids: list[np.ndarray], limits: list[int],
             matching: bool) -> tuple[list[list[int]], list[int]]:
    """The proposer's drafts, and the match length of each where it tells them (matching: n-gram; else [])."""
    if not token_ids:
        return [], []
    if matching:
        return proposer.propose_with_matches(token_ids, limits)
    return proposer.propose(token_ids, limits), []


def _base_tokens(requests: list[Request]) -> int:
    """The next step's tokens without drafts: one a decoding request, the rest of the prompt of the others."""
    return sum(max(1, r.num_tokens - r.num_computed_tokens) for r in requests)


def fit_to_budget(request: Request, num_new: int) -> None:
    """Drop the drafts that the step's `num_new` tokens for this request do not reach."""
    reached = request.num_computed_tokens + num_new - request.num_tokens
    if reached < len(request.spec_token_ids):
        request.spec_token_ids = request.spec_token_ids[:max(0, reached)]


def settle(request: Request, num_drafts: int, tokens: list[int] | None, stats: SpecDecodeStats) -> int:
    """After a step that verified `num_drafts` drafts of `request` and returned `tokens` (the accepted drafts
    and one more): count them, clear the drafts, and return how many were rejected (0 without drafts)."""
    if not num_drafts:
        return 0
    num_accepted = len(tokens) - 1 if tokens else 0
    stats.record(num_drafts, num_accepted)
    request.metrics.num_draft_tokens += num_drafts
    request.metrics.num_accepted_tokens += num_accepted
    request.spec_token_ids = []
    return num_drafts - num_accepted


def drop(request: Request) -> int:
    """Remove the request's drafts (blocks are short); returns how many there were."""
    num, request.spec_token_ids = len(request.spec_token_ids), []
    return num


@dataclass
class SpecDecodeStats:
    """Cumulative counters of verified drafts (vLLM's spec_decode metrics)."""

    num_drafts: int = 0  # verify steps of a request with at least one draft
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)  # [j]: drafts accepted at position (tree: depth) j + 1
    depths: tuple[int, ...] = ()  # tree drafts: the depth of each node (lamina/spec/draft_tree.py); () for chains
    draft_seconds: float = 0.0  # host time spent proposing drafts
    verify_seconds: float = 0.0  # wall time of the engine steps that verified drafts
    # adaptive speculation (SpecPolicy), over the steps where some request could draft:
    policy_steps: int = 0
    policy_off_steps: int = 0  # of which the policy left every request without drafts
    policy_eligible: int = 0  # requests that could draft, summed over those steps
    policy_limit_tokens: int = 0  # drafts the policy allowed them, summed (n-gram, few requests: their caps)
    policy_cut_tokens: int = 0  # drafts proposed, then dropped because they no longer paid
    plain_steps: int = 0  # steps the gate ran without speculation (SpecGate's plain windows)
    full_steps: int = 0  # steps the gate ran drafting without the policy (SpecGate's FULL windows)
    # steps launched on a guess (Scheduler.schedule_guessed): their rows, and those whose guess held
    guessed_rows: int = 0
    guessed_rows_held: int = 0

    def record(self, num_drafts: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        positions = max(self.depths[:num_drafts]) if self.depths else num_drafts
        if len(self.accepted_per_pos) < positions:
            self.accepted_per_pos += [0] * (positions - len(self.accepted_per_pos))
        for j in range(num_accepted):
            self.accepted_per_pos[j] += 1

    def record_policy(self, caps: list[int], limits: list[int], found: list[int], kept: list[int]) -> None:
        """One step of the policy: each request's cap, the limit it chose, the drafts found and those kept."""
        eligible = sum(c > 0 for c in caps)
        if not eligible:
            return
        self.policy_steps += 1
        self.policy_off_steps += not any(kept) and (not any(limits) or any(found))
        self.policy_eligible += eligible
        self.policy_limit_tokens += sum(limits)
        self.policy_cut_tokens += sum(found) - sum(kept)

    @property
    def mean_draft_limit(self) -> float:
        """Drafts the policy allowed a request that could draft, on average (k when it always allows all)."""
        return self.policy_limit_tokens / self.policy_eligible if self.policy_eligible else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a verify step yields on average: accepted drafts + the correction or bonus."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0
