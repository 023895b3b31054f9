"""StepMessages: the scheduler's decisions as data for the worker (lamina/step.py), and what the worker holds.

The worker keeps a copy of every request it has been sent whole. A request goes whole (NewRequestData) the
first time it is scheduled and again after a preemption (the worker dropped it); otherwise only its counters
and block-table changes go (CachedRequestData). Ended and preempted requests are named in the next message,
so the worker drops them before it adds that message's new requests.
"""
from __future__ import annotations

from lamina.engine.request import Request
from lamina.kv.kv_manager import KVCacheManager
from lamina.step import CachedRequestData, Guess, NewRequestData, SchedulerOutput


class StepMessages:
    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv
        self.on_worker: set[str] = set()  # requests the worker holds a copy of (sent whole, not dropped since)
        self._finished: list[str] = []  # ended since the last message

    def build(self, batch: list[Request], num_scheduled: dict[str, int], num_computed: dict[str, int],
              preempted_ids: list[str] | None = None, decode_ahead: bool = False,
              guessed: dict[str, tuple[Guess, list[int]]] | None = None) -> SchedulerOutput:
        """The message of one step: `batch` in order, each computing num_scheduled[id] tokens from
        num_computed[id]; its drafts are each request's spec_token_ids, or for a step launched on a guess the
        drafts after each request's Guess (`guessed`)."""
        new_reqs: list[NewRequestData] = []
        cached = CachedRequestData()
        for request in batch:
            req_id = request.request_id
            start, blocks = self.kv.take_block_update(req_id)
            if req_id in self.on_worker:
                cached.append(req_id, num_computed[req_id], start, blocks)
                continue
            self.on_worker.add(req_id)
            new_reqs.append(NewRequestData(req_id, request.prompt_token_ids, list(request.output_token_ids),
                                           request.sampling_params, request.eos_token_ids, blocks,
                                           num_computed[req_id]))
        finished, self._finished = self._finished, []
        if guessed is None:
            drafts = {r.request_id: list(r.spec_token_ids) for r in batch if r.spec_token_ids}
            guesses = {}
        else:
            drafts = {req_id: list(tokens) for req_id, (_, tokens) in guessed.items() if tokens}
            guesses = {req_id: guess for req_id, (guess, _) in guessed.items()}
        return SchedulerOutput(req_ids=[r.request_id for r in batch], num_scheduled_tokens=num_scheduled,
                               new_reqs=new_reqs, cached_reqs=cached, scheduled_spec_decode_tokens=drafts,
                               finished_req_ids=finished, preempted_req_ids=preempted_ids or [],
                               decode_ahead=decode_ahead, guesses=guesses)

    def preempted(self, req_id: str) -> None:
        """The worker drops its copy (the message names it); the request is sent whole when it runs again."""
        self.on_worker.discard(req_id)

    def finished(self, req_id: str) -> None:
        """The request ended: the next message tells the worker to drop it."""
        self.on_worker.discard(req_id)
        self._finished.append(req_id)
