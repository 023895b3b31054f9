"""Speculator: the engine's side of speculative decoding, around each step.

    engine-side proposer (n-gram):   step t runs  ->  after_tokens: propose from the verified tokens (host)
    worker-side proposer (draft model, EAGLE, Medusa, early exit):
        before_step: draft_limits in the step message (and the scheduler held lookahead KV slots for them)
        step t runs; the worker drafts once its tokens are known  ->  after_tokens: take their count (the
        drafts stay on the worker's device: lamina/step.py's DRAFT_ON_DEVICE)
    either way the next step verifies request.spec_token_ids, cut to max_drafts (max_tokens, max_model_len,
    penalties, min_tokens); the engine may launch it before step t's outputs are processed. after_step: step t's
    wall time, once known (the policy's cost model, the verify time, a decision's share of a step, the gate).

    guessing (n-gram, `guess_ahead`, greedy requests): while step t verifies drafts d, `continuations` proposes
    from the tokens as they would be if every draft were accepted (history + d): its first token guesses the one
    sampled after d, the rest are drafts after that. The engine launches step t + 1 on that guess before step
    t's tokens are read (Scheduler.schedule_guessed), and after_tokens of step t decides nothing while the guess
    holds: the next step is already running.

With the adaptive policy, no decision is made (and the next step may be launched ahead) during a pause of the
policy's (Rest) or a plain window of the gate's (SpecGate: speculation on or off by measured throughput); in the
gate's FULL windows the policy is left out and every request that may draft gets up to k, as without it, and
n-gram launches a step ahead whenever the tokens read so far hold no match and every request is greedy (a look
ahead, below; `_looks_pay` says why not while one samples).

    FULL window, n-gram, greedy, batch 1 (x_t: the token step t samples; "look": a proposal from the tokens read so far)
    step t    read x_t: a match?    no  -> step t+1 plain, and step t+2 launched ahead of x_{t+1}
    step t+1  read x_{t+1}: a look  no  -> step t+3 launched ahead of x_{t+2}, and so on
                                    yes -> step t+3 waits for x_{t+2}, then drafts from it (a match seen a token
                                           early is most often still one a token later)

A look's drafts would follow a token not yet read, so none is kept: it only says whether the next step waits. The
step after a miss costs what off's does (launched ahead) where it cost a synchronous step (docs/speculative.md has
what that saves), and a match that begins with the token in flight is drafted a step late.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from lamina.config import EngineConfig, SpeculativeConfig
from lamina.engine.drafts import SpecDecodeStats, TokenArrays, Verdict, max_drafts, propose_drafts
from lamina.engine.request import Request
from lamina.engine.spec_gate import Arm, SpecGate
from lamina.engine.spec_pacing import GuessRate, Rest
from lamina.engine.spec_policy import SpecPolicy
from lamina.engine.step_cost import StepCostModel
from lamina.spec.ngram import NgramProposer
from lamina.spec.proposer import draft_tree, make_proposer
from lamina.step import DRAFT_ON_DEVICE, ModelRunnerOutput, SchedulerOutput


# the policy's step-cost curve is fitted again after this many observed steps, not after each: a fit cost ~25 us of
# a batch-1 decision's ~80 on an H100's host, and a curve of medians over 16-step buckets moves slowly
COST_REFIT_EVERY = 8
DECISION_MEMO_STEPS = 32  # ... and its n-gram answers for a few requests are kept this many steps (SpecPolicy)


class Speculator:
    def __init__(self, config: SpeculativeConfig, max_model_len: int, stats: SpecDecodeStats,
                 policy: SpecPolicy | None = None, gate: SpecGate | None = None) -> None:
        """policy None: every request that may draft gets up to k drafts; gate None: speculation never paused
        for a plain window (the gate is meant to go with a policy). With config.guess_ahead n-gram proposes
        continuations to launch steps on (the module docstring)."""
        self.config = config
        self.k = config.num_speculative_tokens
        self.max_model_len = max_model_len
        self.stats = stats
        self.policy = policy
        self.gate = gate
        self.proposer = make_proposer(config)  # None: the worker drafts
        tree = draft_tree(config)
        stats.depths = () if tree is None else tree.depths
        self._arrays = TokenArrays()  # the drafting requests' tokens as numpy arrays, for the n-gram proposer
        # n-gram's continuations: the guessed token and up to k drafts after it
        self._guesser = (NgramProposer(self.k + 1, config.prompt_lookup_min, config.prompt_lookup_max)
                         if config.guess_ahead and isinstance(self.proposer, NgramProposer) else None)
        self._guess_rates: dict[str, GuessRate] = {}  # request id -> its guesses' rate (requests in flight)
        self._rest = Rest()
        self._decision_share = 0.0  # a decision's host time over the step's (EMA), for Rest
        self._decision_seconds: float | None = None  # the last decision's, until its step's time is known
        self._observe_next = False  # whether after_step feeds the step's time to the policy's cost model
        self._emitted = 0  # tokens the step emitted, for the gate
        self._step_arm = self._next_arm = Arm.SPEC  # the gate's arm this step's / the next's drafts were decided in
        self._policy_skipped = False  # whether steps ran since the policy last read the requests (FULL windows)
        self.has_drafts = False  # whether after_tokens left drafts for the next step (the engine launches it early)
        self._next_waits = True  # FULL, n-gram: whether the step after the next waits for the next one's tokens
        self._compiled = False  # whether the step compiled a kernel (no sample of its speed)
        self._greedy_of: tuple[list[str], bool] = ([], True)  # the last step's request ids, all greedy (_all_greedy)

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots past a request's tokens that the worker's proposer writes into (0 for n-gram)."""
        return 0 if self.proposer is not None else self.k

    def wants_sync(self) -> bool:
        """Whether the next step must wait for this one's tokens (no step launched ahead): without the policy
        always (k fixed; a worker-side proposer's FULL window) or while the tokens read so far hold a match
        (n-gram's FULL window: the module docstring), and with it whenever a decision is due (not during a pause
        or a plain window)."""
        arm = self._arm()
        if self._policy_in(arm) is None:
            return self._next_waits or not self._looks_ahead()
        return not (self._rest.left or arm is Arm.PLAIN)

    def _looks_ahead(self) -> bool:
        """Whether steps launch ahead while no match is in sight: n-gram in the gate's FULL windows."""
        return self.proposer is not None and self.gate is not None and self.gate.full

    def _plain(self) -> bool:
        return self._arm() is Arm.PLAIN

    def _arm(self) -> Arm:
        """The gate's current window's arm (SPEC without a gate). The per-step methods read it once: at batch 1 on
        a GPU a step is the host's, and a plain window's step should cost the gate's accounting alone."""
        return self.gate.arm if self.gate is not None else Arm.SPEC

    def _deciding(self) -> SpecPolicy | None:
        """The policy, unless the gate's window drafts without it (FULL) or there is none (k fixed)."""
        return self._policy_in(self._arm())

    def _policy_in(self, arm: Arm) -> SpecPolicy | None:
        """_deciding() for a window of `arm`, read once by the per-step methods."""
        return None if arm is Arm.FULL else self.policy

    def before_step(self, scheduled: SchedulerOutput, requests: list[Request]) -> None:
        """Ask the worker for drafts of the requests whose scheduled range reaches their end."""
        policy = self._deciding()
        if self.proposer is not None or (policy is not None and (self._rest.left or self._plain())):
            return
        ids = [r.request_id for r in requests]
        caps = [max_drafts(r, self.k, self.max_model_len, ahead=1)
                if r.num_computed_tokens + scheduled.num_scheduled_tokens[r.request_id] >= r.num_tokens else 0
                for r in requests]
        if policy is not None:
            caps = policy.draft_limits(ids, caps)
            self._rest.decided(Verdict.DRAFTING if any(caps) else Verdict.OFF)
        scheduled.draft_limits.update((request_id, limit) for request_id, limit in zip(ids, caps) if limit)

    def continuations(self, scheduled: SchedulerOutput, requests: list[Request]) -> dict[str, list[int]]:
        """For `scheduled`, a step verifying n-gram drafts whose tokens are not read yet: each request's guess
        of the token after its drafts and up to as many drafts after that (at least one), proposed from its
        tokens followed by its drafts (the module docstring). Empty without a guesser; a request that samples (its
        step launched on a guess that held was no shorter: docs/speculative.md), whose guesses fail too often to
        pay (GuessRate), that may not draft after those tokens (max_drafts) or whose proposal is shorter has
        none."""
        drafts = scheduled.scheduled_spec_decode_tokens
        if self._guesser is None or not drafts:
            return {}
        rates = self._guess_rates = {r.request_id: self._guess_rates.get(r.request_id) or GuessRate()
                                     for r in requests}
        asking, histories, limits = [], [], []
        for request in requests:
            own = drafts.get(request.request_id)
            cap = 0 if not own else max_drafts(request, len(own), self.max_model_len, ahead=len(own) + 1)
            if cap and request.sampling_params.greedy and rates[request.request_id].wants():
                asking.append(request.request_id)
                histories.append(np.concatenate((self._arrays.of(request), np.asarray(own, dtype=np.int64))))
                limits.append(cap + 1)
        proposed = self._guesser.propose(histories, limits) if asking else []
        return {req_id: tokens for req_id, tokens in zip(asking, proposed) if len(tokens) >= 2}

    def observe_guesses(self, held: dict[str, bool]) -> None:
        """Whether each request's guess held, once the tokens it guessed are read."""
        for req_id, ok in held.items():
            if (rate := self._guess_rates.get(req_id)) is not None:
                rate.observe(ok)

    def after_tokens(self, scheduled: SchedulerOutput, result: ModelRunnerOutput, running: list[Request],
                     next_guessed: bool = False, next_launched: bool = False) -> None:
        """Set the drafts of the next step (request.spec_token_ids) once this step's tokens are known (before its
        outputs are processed: the engine may launch the next step first). `next_guessed`: the next step was
        launched on a guess that held (the module docstring): nothing is decided now. `next_launched`: the next
        step was launched ahead of these tokens (n-gram's FULL window then only looks for a match)."""
        self._observe_next = self.has_drafts = False
        self._emitted = sum(map(len, result.sampled_token_ids.values()))
        self._compiled = bool(result.num_compiles)
        arm = self._arm()
        self._step_arm, self._next_arm = self._next_arm, arm
        policy = self._policy_in(arm)
        if next_guessed:
            self._observe_next = policy is not None and not result.num_compiles
            return
        # one step of the policy's pause passes (a plain window of the gate's leaves the pause as it is)
        plain = arm is Arm.PLAIN
        resting = policy is not None and (plain or self._rest.resting())
        worker_drafts = self.proposer is None and bool(scheduled.scheduled_spec_decode_tokens or result.num_drafts)
        if resting and not worker_drafts and (self.proposer is not None or plain):
            # nobody drafts (spec_token_ids were settled after the last verify step), and nothing is done per
            # request: a plain window's step costs the gate's accounting alone. (A worker-side proposer's steps in
            # the policy's own pause still sample the cost model: they are its plain steps.)
            return
        self._observe_next = policy is not None and not result.num_compiles  # a compiling step is no sample
        self._resync(policy, running)
        start = time.perf_counter()
        if next_launched and policy is None and self._looks_ahead():
            self._next_waits = not self._looks_pay(running) or self._match_in_sight(running)
            self.stats.draft_seconds += time.perf_counter() - start
            return
        if self.proposer is not None:
            pause = self._rest.if_nothing_drafted(self._decision_share) if policy is not None else None
            verdict = propose_drafts(self.proposer, running, self.k, self.max_model_len, self._arrays, policy,
                                     self.stats, decline_pause=pause)
            if policy is not None:
                # the whole decision's host time (policy, proposal, bookkeeping) is what drafting costs a step
                self._decision_seconds = time.perf_counter() - start
                policy.observe_drafting(len(running), self._decision_seconds)
                self._rest.decided(verdict, self._decision_share)
        elif worker_drafts:
            self._take_worker_drafts(result, running, policy)
        elif policy is not None:
            policy.tick()  # a SPEC step without drafts: the estimates age (spec_policy.py: Exploration)
        # drafts are set above only (else they were settled after the last verify step): no O(rows) scan otherwise
        self.has_drafts = (self.proposer is not None or worker_drafts) and any(r.spec_token_ids for r in running)
        self._next_waits = self.has_drafts or not self._looks_pay(running)
        self.stats.draft_seconds += time.perf_counter() - start

    @staticmethod
    def _looks_pay(running: list[Request]) -> bool:
        """FULL, n-gram: whether looking ahead pays (else the step after the next waits for the next one's tokens
        even with no match in sight): only while every request is greedy. A look misses the matches that begin with
        the token in flight; measured on GPUs it pays for greedy requests, and for sampled ones not on every prompt
        set (docs/speculative.md, "Looking ahead in FULL windows")."""
        return all_greedy(running)

    def _match_in_sight(self, running: list[Request]) -> bool:
        """Whether any request that may draft has a match in the tokens read so far (a look: its drafts would
        follow the token the step in flight samples, so none is kept; the requests' drafts stay as they are)."""
        self._arrays.keep_only({r.request_id for r in running})
        return any(self.proposer.has_match(self._arrays.of(r)) for r in running
                   if max_drafts(r, self.k, self.max_model_len, ahead=1))

    def after_step(self, scheduled: SchedulerOutput, step_seconds: float, requests: list[Request],
                   draining: bool = False) -> None:
        """The step's wall time, once its outputs are processed: the verify time, the policy's cost model, and
        the share of a step that the decision after it took. The decision ran inside the step's call; the policy
        charges it apart (c_draft), so its cost model gets the step without it. `requests`: the step's (the gate
        measures greedy steps apart); `draining`: none waits to be admitted (the gate charges the slowest row)."""
        if scheduled.scheduled_spec_decode_tokens:
            self.stats.verify_seconds += step_seconds
        decision, self._decision_seconds = self._decision_seconds, None
        own_seconds = step_seconds - (decision or 0.0)
        if self._observe_next:
            self.policy.observe_scheduled(scheduled, own_seconds)
        if decision is not None:
            self._observe_decision(decision, own_seconds)
        if self.gate is not None:
            arm = self.gate.arm
            self.stats.plain_steps += arm is Arm.PLAIN
            self.stats.full_steps += arm is Arm.FULL
            self.gate.observe(len(scheduled.req_ids), self._emitted, step_seconds, self._step_arm,
                              countable=not self._compiled, greedy=self._all_greedy(scheduled.req_ids, requests),
                              draining=requests if draining else ())

    def _all_greedy(self, req_ids: list[str], requests: list[Request]) -> bool:
        """all_greedy(requests), read only when the step's request ids differ from the last step's (host time)."""
        if req_ids != self._greedy_of[0]:
            self._greedy_of = req_ids, all_greedy(requests)
        return self._greedy_of[1]

    def _observe_decision(self, seconds: float, step_seconds: float) -> None:
        if step_seconds > 0:
            share = seconds / step_seconds
            self._decision_share = 0.9 * self._decision_share + 0.1 * share if self._decision_share else share

    def _resync(self, policy: SpecPolicy | None, running: list[Request]) -> None:
        """The policy reads the requests' verifies at each of its decisions; those of the steps decided without it
        (the gate's FULL windows) are skipped, not learned from as if they were one verify of the policy's."""
        if policy is None:
            self._policy_skipped = self.policy is not None
        elif self._policy_skipped:
            policy.skip_verifies(running)
            self._policy_skipped = False

    def _take_worker_drafts(self, result: ModelRunnerOutput, running: list[Request], policy: SpecPolicy | None
                            ) -> None:
        """The worker's drafts (held on its device: DRAFT_ON_DEVICE entries), cut to max_drafts and to what still
        pays (the policy deciding now, with the drafts found)."""
        if policy is not None:
            policy.observe_requests(running)  # the acceptance of the step's verified drafts
        for request in running:
            proposed = result.num_drafts.get(request.request_id, 0)
            request.spec_token_ids = [DRAFT_ON_DEVICE] * min(proposed, max_drafts(request, self.k,
                                                                                   self.max_model_len))
        if policy is not None and any(r.spec_token_ids for r in running):
            kept = policy.draft_limits([r.request_id for r in running], [len(r.spec_token_ids) for r in running],
                                       drafting_cost=False)
            for request, keep in zip(running, kept):
                del request.spec_token_ids[keep:]


def make_speculator(spec: SpeculativeConfig, config: EngineConfig, device: torch.device, max_model_len: int,
                    stats: SpecDecodeStats) -> Speculator:
    """The engine's speculator: with spec.adaptive, the policy and the gate."""
    policy = make_policy(spec, config, device)
    return Speculator(spec, max_model_len, stats, policy, SpecGate(full=True) if policy is not None else None)


def make_policy(spec: SpeculativeConfig, config: EngineConfig, device: torch.device) -> SpecPolicy | None:
    """The adaptive policy (spec.adaptive), told the shapes of the verify steps the worker captures."""
    if not spec.adaptive:
        return None
    sched = config.scheduler_config
    graphs = device.type == "cuda" and not config.enforce_eager  # the worker's graph_decision, roughly
    return SpecPolicy(cost=StepCostModel(refit_every=COST_REFIT_EVERY), memo_steps=DECISION_MEMO_STEPS,
                      graph_query_lens=spec.verify_query_lens if graphs else (),
                      graph_max_rows=min(config.cuda_graph_max_batch_size, sched.max_num_seqs) if graphs else 0,
                      max_step_tokens=sched.max_num_batched_tokens)


def all_greedy(requests: list[Request]) -> bool:
    """Whether every request samples greedily."""
    return all(r.sampling_params.greedy for r in requests)
