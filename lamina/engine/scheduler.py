"""The scheduler: one token budget per step over the two counters of every request.

Each step, running requests come first (1 token for a decode, the rest of a prompt chunk, or
1 + k with drafts), then waiting requests are admitted while budget, sequence slots and KV blocks
last. When blocks run out the newest running request is preempted (recompute: its blocks are
freed, committed ones stay in the prefix cache) and no new request is admitted that step.
Pure Python: no tensors. Each step's decision goes to the worker as a data message built by StepMessages
(lamina/engine/step_message.py).
"""
from __future__ import annotations

import time
from collections import deque

from lamina.config import SchedulerConfig
from lamina.engine import drafts, prompt_logprobs
from lamina.engine.request import Request, RequestStatus
from lamina.engine.stats import SchedulerStats
from lamina.engine.step_message import StepMessages
from lamina.kv.kv_manager import KVCacheManager
from lamina.kv.types import PrefixMatch
from lamina.step import Guess, ModelRunnerOutput, SchedulerOutput


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_manager: KVCacheManager, max_model_len: int) -> None:
        self.config = config
        self.kv = kv_manager
        self.max_model_len = max_model_len
        self.num_lookahead_tokens = 0  # KV slots a worker-side proposer drafts into (set by the engine)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.messages = StepMessages(kv_manager)
        self.stats = SchedulerStats()

    # ---- requests in and out -------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish_request(self, request_id: str, status: RequestStatus, stop_reason: int | str | None = None) -> None:
        """End a request from outside the step loop (abort, or a stop string found by the detokenizer)."""
        request = self.requests.get(request_id)
        if request is None or request.is_finished:
            return
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        request.stop_reason = stop_reason
        self._free(request, status)

    def fail_request(self, request_id: str, error: str) -> None:
        """End a request whose part of a step raised (finish_reason "error"); its blocks are freed."""
        request = self.requests.get(request_id)
        if request is not None and not request.is_finished:
            request.error = error
            self.finish_request(request_id, RequestStatus.FINISHED_ERROR)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ---- one step ------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        batch: list[Request] = []
        num_scheduled: dict[str, int] = {}
        preempted = self._schedule_running(batch, num_scheduled, budget)
        budget -= sum(num_scheduled.values())
        self.stats.kv_limited = bool(preempted)
        if not preempted:
            self._schedule_waiting(batch, num_scheduled, budget)
        return self.messages.build(batch, num_scheduled, {r.request_id: r.num_computed_tokens for r in batch},
                                   preempted_ids=[r.request_id for r in preempted])

    def _schedule_running(self, batch: list[Request], num_scheduled: dict[str, int],
                          budget: int) -> list[Request]:
        preempted: list[Request] = []
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = min(request.num_tokens_with_spec - request.num_computed_tokens, budget)
            if num_new <= 0:
                i += 1
                continue
            drafts.fit_to_budget(request, num_new)
            while not self._allocate(request, num_new):
                if request.spec_token_ids:  # drafts are optional: drop them before preempting anyone
                    num_new -= drafts.drop(request)
                    continue
                victim = self.running.pop()  # the newest running request
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    return preempted
            batch.append(request)
            num_scheduled[request.request_id] = num_new
            budget -= num_new
            i += 1
        return preempted

    def _schedule_waiting(self, batch: list[Request], num_scheduled: dict[str, int], budget: int) -> None:
        for request in list(self.waiting):
            if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
                return
            if self._waits_for_parent(request):
                continue
            num_new = self._admit(request, budget)
            if num_new == 0:
                self.stats.kv_limited = True
                return  # out of KV blocks: keep FCFS order, try again next step
            batch.append(request)
            num_scheduled[request.request_id] = num_new
            budget -= num_new

    def _admit(self, request: Request, budget: int) -> int:
        """Give a waiting request its cached prefix and blocks for its first chunk; 0 if no room."""
        prefix = None
        if not self.kv.block_ids(request.request_id):
            shared = self._share_parent_prompt(request)
            if shared == 0:  # a prompt to score is computed whole: no cache hit (vLLM's rule)
                prefix = PrefixMatch() if prompt_logprobs.scores_prompt(request) else self.kv.match_prefix(request)
            num_computed = shared or prefix.num_tokens
            request.num_computed_tokens = shared  # the forked blocks hold these tokens' KV (the base of allocate_slots)
        else:
            num_computed = request.num_computed_tokens
        num_new = min(request.num_tokens - num_computed, budget)
        if not self._allocate(request, num_new, prefix):
            return 0
        request.num_computed_tokens = num_computed
        if request.metrics.first_scheduled_time is None:
            request.metrics.first_scheduled_time = time.monotonic()
            request.metrics.num_cached_tokens = num_computed
        self.waiting.remove(request)
        self.running.append(request)
        request.status = RequestStatus.RUNNING
        return num_new

    def _allocate(self, request: Request, num_new: int, prefix: PrefixMatch | None = None) -> bool:
        """Blocks for `num_new` tokens, and for the lookahead slots when they reach the request's end (optional)."""
        end = (request.num_computed_tokens if prefix is None else prefix.num_tokens) + num_new
        lookahead = min(self.num_lookahead_tokens, self.max_model_len - end) if end >= request.num_tokens else 0
        return (lookahead > 0 and self.kv.allocate_slots(request, num_new + lookahead, prefix)) or \
            self.kv.allocate_slots(request, num_new, prefix)

    def _waits_for_parent(self, request: Request) -> bool:
        """Sample i > 0 of an n > 1 request starts once sample 0 has computed the prompt, to share it."""
        parent = request.parent
        if parent is None or parent.is_finished:
            return False
        return parent.num_computed_tokens < parent.num_prompt_tokens

    def _share_parent_prompt(self, request: Request) -> int:
        parent = request.parent
        if parent is None or parent.is_finished or self.kv.enable_prefix_caching:
            return 0  # with the prefix cache on, sample 0's committed prompt blocks are a cache hit
        # only the prompt is shared (a sample resumed after preemption has outputs of its own)
        cap = min(parent.num_computed_tokens, request.num_prompt_tokens, request.num_tokens - 1)
        return self.kv.fork(parent, request, cap)

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        self.messages.preempted(request.request_id)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.metrics.num_preemptions += 1
        self.stats.num_preemptions += 1
        self.waiting.appendleft(request)

    def schedule_ahead(self, inflight: SchedulerOutput) -> SchedulerOutput | None:
        """The decode step after `inflight`, a step launched but whose tokens the host has not seen;
        None when that step cannot be decided before they arrive.

        Every request of `inflight` that samples a token there and cannot run out of length with it
        decodes one more token (at position num_tokens: the token `inflight` samples, read on the
        device). None when anything needs the host to see the tokens first: a waiting request (to
        admit), a running request outside `inflight` or one mid-prompt or with drafts, penalties or
        min_tokens (they read the output so far), or KV blocks short (preemption). A request that
        stops on a token of `inflight` (EOS, stop token, stop string) computes one token for nothing:
        `update_from_output` drops the results of finished requests.
        """
        unfinished = self.live_requests(inflight)
        if self.waiting or len(self.running) != len(unfinished):
            return None
        batch: list[Request] = []
        for request in unfinished:
            scheduled = inflight.num_scheduled_tokens[request.request_id]
            if request.spec_token_ids or request.num_computed_tokens + scheduled != request.num_tokens:
                return None  # drafts, or mid-prompt: no token sampled in `inflight`
            if _reads_its_output(request):
                return None
            if not self._runs_out_with_one_more(request):
                batch.append(request)
        for request in batch:
            if not self.kv.allocate_slots(request, inflight.num_scheduled_tokens[request.request_id] + 1):
                return None  # blocks taken so far stay with their requests: the next steps use them
        if not batch:
            return None
        # each computes position num_tokens: the token `inflight` samples for it
        return self.messages.build(batch, {r.request_id: 1 for r in batch},
                                   {r.request_id: r.num_tokens for r in batch}, decode_ahead=True)

    def schedule_guessed(self, inflight: SchedulerOutput, continuations: dict[str, list[int]]
                         ) -> SchedulerOutput | None:
        """The step after `inflight`, a step verifying drafts whose tokens the host has not seen, launched on a
        guess: that every request accepts all its drafts there and samples continuations[id][0] after them. It
        computes that token and verifies continuations[id][1:] as its drafts:

            request r:  | ... | last | d_0 .. d_{k-1} | c_0 | c_1 .. c_j |
                                ^ inflight computes      ^ this step computes c_0 .. c_j (start: num_computed)
                                  last .. d_{k-1}

        None when it cannot be decided now: as for schedule_ahead (a waiting request, a running request outside
        `inflight`, KV blocks short), a request without drafts in `inflight` or without a continuation, or one
        whose own guess in `inflight` failed. A request whose guess fails gets nothing from this step
        (update_from_output), as one that stopped in `inflight`."""
        unfinished = self.live_requests(inflight)
        if self.waiting or not unfinished or len(self.running) != len(unfinished):
            return None
        guessed, num_scheduled, num_computed = {}, {}, {}
        for request in unfinished:
            req_id = request.request_id
            drafts, continuation = inflight.scheduled_spec_decode_tokens.get(req_id), continuations.get(req_id)
            own_guess = inflight.guesses.get(req_id)
            if not drafts or not continuation or (own_guess is not None
                                                  and not own_guess.held_by(request.all_token_ids)):
                return None
            guessed[req_id] = (Guess(request.num_tokens, [*drafts, continuation[0]]), continuation[1:])
            num_computed[req_id] = request.num_tokens + len(drafts)
            num_scheduled[req_id] = len(continuation)
        for request in unfinished:
            req_id = request.request_id
            if not self.kv.allocate_slots(request, inflight.num_scheduled_tokens[req_id] + num_scheduled[req_id]):
                return None  # blocks taken so far stay with their requests: the next steps use them
        return self.messages.build(unfinished, num_scheduled, num_computed, guessed=guessed)

    def check_guesses(self, scheduled: SchedulerOutput) -> dict[str, bool]:
        """After the step before `scheduled` (launched on guesses) is read: whether each request's guess held (not
        for one that ended meanwhile); counted in the speculative stats."""
        held = {request.request_id: guess.held_by(request.all_token_ids)
                for request in self.live_requests(scheduled)
                if (guess := scheduled.guesses.get(request.request_id)) is not None}
        self.stats.spec.guessed_rows += len(scheduled.guesses)
        self.stats.spec.guessed_rows_held += sum(held.values())
        return held

    def live_requests(self, scheduled: SchedulerOutput) -> list[Request]:
        """The requests of a step still running (not one that ended, even if a waiting request reuses its id)."""
        live, requests, running = [], self.requests, RequestStatus.RUNNING
        for req_id in scheduled.req_ids:
            request = requests.get(req_id)
            if request is not None and request.status is running:
                live.append(request)
        return live

    def _runs_out_with_one_more(self, request: Request) -> bool:
        """The next sampled token ends the request by length (max_tokens or max_model_len)."""
        max_tokens = request.sampling_params.max_tokens
        return ((max_tokens is not None and request.num_output_tokens + 1 >= max_tokens)
                or request.num_tokens + 1 >= self.max_model_len)

    # ---- after the model ran -------------------------------------------------------------

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> list[Request]:
        """Advance counters, append sampled tokens, stop-check, commit and free. Returns the
        requests that received tokens or finished this step."""
        now = time.monotonic()
        changed: list[Request] = []
        guesses = scheduler_output.guesses
        for request in self.live_requests(scheduler_output):  # one that ended while this step ran ahead: void
            guess = guesses.get(request.request_id) if guesses else None
            if guess is not None and not guess.held_by(request.all_token_ids):
                continue  # launched on a guess that failed: its rows are void
            if request.request_id in runner_output.failed:
                self.fail_request(request.request_id, runner_output.failed[request.request_id])
                changed.append(request)
                continue
            tokens = runner_output.sampled_token_ids.get(request.request_id)
            num_drafts = len(scheduler_output.scheduled_spec_decode_tokens.get(request.request_id, ()))
            rejected = drafts.settle(request, num_drafts, tokens, self.stats.spec)  # their KV is void
            request.num_computed_tokens += scheduler_output.num_scheduled_tokens[request.request_id] - rejected
            prompt_logprobs.receive(request, runner_output.prompt_logprobs.get(request.request_id))
            if tokens:
                self._append_tokens(request, tokens, runner_output, now)
                changed.append(request)
            self.kv.commit(request, min(request.num_computed_tokens, request.num_tokens))
            if request.is_finished:
                self.running.remove(request)
                self._free(request, request.status)
        self.stats.record_step(scheduler_output.total_num_scheduled_tokens)
        return changed

    def _append_tokens(self, request: Request, tokens: list[int], runner_output: ModelRunnerOutput,
                       now: float) -> None:
        logprobs = runner_output.logprobs.get(request.request_id)
        for i, token in enumerate(tokens):
            request.append_output_token_ids([token])
            if request.logprobs is not None and logprobs is not None:
                request.logprobs.append(logprobs[i])
                request.cumulative_logprob += logprobs[i][token].logprob
            status = self._check_stop(request, token)
            if status is not None:
                request.status = status
                break
        metrics = request.metrics
        if metrics.first_token_time is None:
            metrics.first_token_time = now
        metrics.last_token_time = now
        metrics.num_generation_tokens = request.num_output_tokens

    def _check_stop(self, request: Request, token: int) -> RequestStatus | None:
        params = request.sampling_params
        if request.num_output_tokens >= params.min_tokens:
            if token in request.eos_token_ids and not params.ignore_eos:
                return RequestStatus.FINISHED_STOPPED
            if token in params.stop_token_ids:
                request.stop_reason = token
                return RequestStatus.FINISHED_STOPPED
        # max_tokens None: until the context is full; either way never past max_model_len.
        out_of_tokens = params.max_tokens is not None and request.num_output_tokens >= params.max_tokens
        if out_of_tokens or request.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _free(self, request: Request, status: RequestStatus) -> None:
        request.status = status
        request.metrics.finished_time = time.monotonic()
        self.kv.free(request)
        del self.requests[request.request_id]
        self.messages.finished(request.request_id)

    def make_stats(self) -> SchedulerStats:
        """Refresh the snapshot's gauges from the queues and the KV cache."""
        return self.stats.refresh(len(self.running), len(self.waiting), self.kv)


def _reads_its_output(request: Request) -> bool:
    """Sampling that depends on the tokens generated so far (so it cannot run ahead of them)."""
    params = request.sampling_params
    return params.has_penalties or request.num_output_tokens < params.min_tokens
