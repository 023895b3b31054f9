"""Speculator: the engine's side of speculative decoding, around each step.

    engine-side proposer (n-gram):   step t runs  ->  after_step: propose from the verified tokens (host)
    worker-side proposer (draft model, Medusa, early exit):
        before_step: draft_limits in the step message (and the scheduler held lookahead KV slots for them)
        step t runs; the worker drafts once its tokens are known  ->  after_step: take its drafts
    either way the next step verifies request.spec_token_ids, cut to max_drafts (max_tokens, max_model_len,
    penalties, min_tokens).
"""
from __future__ import annotations

import time

from lamina.config import SpeculativeConfig
from lamina.engine.drafts import SpecDecodeStats, TokenArrays, max_drafts, propose_drafts
from lamina.engine.request import Request
from lamina.spec.proposer import make_proposer
from lamina.step import ModelRunnerOutput, SchedulerOutput


class Speculator:
    def __init__(self, config: SpeculativeConfig, max_model_len: int, stats: SpecDecodeStats) -> None:
        self.config = config
        self.k = config.num_speculative_tokens
        self.max_model_len = max_model_len
        self.stats = stats
        self.proposer = make_proposer(config)  # None: the worker drafts
        self._arrays = TokenArrays()  # the drafting requests' tokens as numpy arrays, for the n-gram proposer

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots past a request's tokens that the worker's proposer writes into (0 for n-gram)."""
        return 0 if self.proposer is not None else self.k

    def before_step(self, scheduled: SchedulerOutput, requests: list[Request]) -> None:
        """Ask the worker for drafts of the requests whose scheduled range reaches their end."""
        if self.proposer is not None:
            return
        for request in requests:
            num_new = scheduled.num_scheduled_tokens[request.request_id]
            if request.num_computed_tokens + num_new >= request.num_tokens:
                limit = _limit_after_one_more(request, self.k, self.max_model_len)
                if limit:
                    scheduled.draft_limits[request.request_id] = limit

    def after_step(self, scheduled: SchedulerOutput, result: ModelRunnerOutput, running: list[Request],
                   step_seconds: float) -> None:
        """Set the drafts of the next step (request.spec_token_ids); count the time of drafting and verifying."""
        if scheduled.scheduled_spec_decode_tokens:
            self.stats.verify_seconds += step_seconds
        start = time.perf_counter()
        if self.proposer is not None:
            propose_drafts(self.proposer, running, self.k, self.max_model_len, self._arrays)
        else:
            for request in running:
                proposed = result.draft_token_ids.get(request.request_id, [])
                request.spec_token_ids = proposed[:max_drafts(request, self.k, self.max_model_len)]
        self.stats.draft_seconds += time.perf_counter() - start


def _limit_after_one_more(request: Request, k: int, max_model_len: int) -> int:
    """max_drafts as it will be once the step gives the request one more token (or more: the engine cuts the
    drafts again when they arrive)."""
    params = request.sampling_params
    if params.has_penalties or request.num_output_tokens + 1 < params.min_tokens:
        return 0
    room = max_model_len - request.num_tokens - 2
    if params.max_tokens is not None:
        room = min(room, params.max_tokens - request.num_output_tokens - 2)
    return max(0, min(k, room))
