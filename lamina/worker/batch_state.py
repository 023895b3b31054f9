"""BatchState: the worker's own copy of every request it has been sent, kept in sync by the step messages.

    apply(step k message):  drop finished + preempted ids -> add new_reqs -> update cached_reqs
    record(step k answer):  append each request's sampled tokens to its token ids (not those of a step
                            launched on a guess that failed: lamina/step.py's Guess)

A request's token ids cross the seam once (in NewRequestData); after that the worker appends the tokens it
samples itself, so for every request it holds:

    token_ids == prompt + verified outputs (the scheduler's all_token_ids), once the answers of all steps
                 launched before have been recorded (a decode_ahead step reads its input from the device)
    block_ids == the KV manager's block table for it (updated as table[start:] = new ids)

Per-request penalty counts live on the device (PenaltyState) and follow the same adds and drops.

A request's `seed` keys its samples (lamina.layers.sampling_metadata.seeded_keys): the SamplingParams' seed, or,
when the BatchState has `salts` (a worker that drafts with a network: lamina/spec/draft_sampling.py), a random salt
drawn when the request arrives, which keys the rows that verify its drafts (its other rows draw from the shared
stream), so that a drafter can draw its drafts with the noise of those rows.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from lamina.sampling_params import SamplingParams
from lamina.step import Guess, ModelRunnerOutput, NewRequestData, SchedulerOutput
from lamina.worker.penalty_state import PenaltyState


@dataclass(slots=True)
class RequestState:
    """One request as the worker knows it."""

    req_id: str
    token_ids: list[int]  # prompt + outputs
    num_prompt_tokens: int
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int]
    block_ids: list[int]
    num_computed_tokens: int
    seed: int | None = None  # the key of its samples (module docstring); None: drawn from the shared stream

    @classmethod
    def from_new(cls, new: NewRequestData, salt: int | None = None) -> RequestState:
        seed = new.sampling_params.seed if new.sampling_params.seed is not None else salt
        return cls(new.req_id, list(new.prompt_token_ids) + list(new.output_token_ids), len(new.prompt_token_ids),
                   new.sampling_params, new.eos_token_ids, list(new.block_ids), new.num_computed_tokens, seed)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]


class BatchState:
    def __init__(self, penalties: PenaltyState, salts: random.Random | None = None) -> None:
        """`salts`: the source of the unseeded requests' salts (module docstring); None: they get none."""
        self.requests: dict[str, RequestState] = {}
        self.penalties = penalties
        self.salts = salts

    def __getitem__(self, req_id: str) -> RequestState:
        return self.requests[req_id]

    def __len__(self) -> int:
        return len(self.requests)

    def apply(self, scheduled: SchedulerOutput) -> None:
        """Bring the copies up to the message's state: drops first (an id may be reused by a new request)."""
        for req_id in (*scheduled.finished_req_ids, *scheduled.preempted_req_ids):
            self.remove(req_id)
        for new in scheduled.new_reqs:
            if new.req_id in self.requests:
                raise ValueError(f"new_reqs: request {new.req_id!r} is already held by the worker")
            salt = None if self.salts is None else self.salts.getrandbits(64)
            state = self.requests[new.req_id] = RequestState.from_new(new, salt)
            self.penalties.add(new.req_id, new.prompt_token_ids, state.output_token_ids, new.sampling_params)
        cached = scheduled.cached_reqs
        for req_id, computed, start, blocks in zip(cached.req_ids, cached.num_computed_tokens,
                                                    cached.block_ids_start, cached.new_block_ids):
            state = self.requests.get(req_id)
            if state is None:
                raise ValueError(f"cached_reqs: request {req_id!r} is not held by the worker")
            state.num_computed_tokens = computed
            if blocks or start < len(state.block_ids):
                state.block_ids[start:] = blocks

    def remove(self, req_id: str) -> None:
        if self.requests.pop(req_id, None) is not None:
            self.penalties.remove(req_id)

    def record(self, output: ModelRunnerOutput, guesses: dict[str, Guess] | None = None) -> None:
        """Append the sampled tokens of the requests still held (one that ended meanwhile is gone). `guesses`:
        the step was launched on them (lamina/step.py); a request whose guess failed gets none."""
        for req_id, token_ids in output.sampled_token_ids.items():
            state = self.requests.get(req_id)
            guess = guesses.get(req_id) if guesses else None
            if state is not None and (guess is None or guess.held_by(state.token_ids)):
                state.token_ids.extend(token_ids)
