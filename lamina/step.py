"""The step message: plain data from the scheduler to the worker(s), and the worker's answer.

Both sides import this module; it imports neither. Nothing here holds a tensor of the scheduler's or a
callable, so a message pickles cheaply (a multi-process executor broadcasts it to every rank).

The worker keeps its own copy of every request it has been sent (lamina/worker/batch_state.py) and the
message carries only what changed:

    step k:  new_reqs           requests scheduled for the first time, or again after a preemption: all
                                their tokens so far, sampling params, block table, num_computed_tokens
             cached_reqs        the others: num_computed_tokens and the change to their block table
                                (block_ids[start:] = new ids: an append, or a rewrite from `start` when the
                                prefix cache swapped a block for its cached twin)
             num_scheduled_tokens, scheduled_spec_decode_tokens (drafts, after the verified tokens)
             finished_req_ids, preempted_req_ids   rows the worker drops before adding this step's rows

Tokens sampled by the worker come back in ModelRunnerOutput and the worker appends them to its own copy,
so a request's token ids cross the seam once (when it is new) and never again.

A `decode_ahead` step (Scheduler.schedule_ahead) was scheduled while the step before it was still running:
each of its requests computes one token at position num_computed_tokens, the token that step samples,
which the worker takes from that step's output on the device.

A step launched on a guess (Scheduler.schedule_guessed, n-gram drafts) was scheduled while the step before it,
which verifies drafts, was still running: it assumes that step accepts all of its drafts and samples the
proposer's next token after them. `guesses[r]` names those tokens and where they start (the worker has not read
them yet); the step's rows of a request whose guess did not hold are void, on both sides (Guess.held_by).

Drafts of a worker-side proposer (draft model, EAGLE, Medusa, early exit) never cross the seam: the worker
answers how many it holds (ModelRunnerOutput.num_drafts), the engine schedules that many (or fewer) as
DRAFT_ON_DEVICE entries of scheduled_spec_decode_tokens, and the worker fills in the ids from its device
(the first ones, when the engine schedules fewer).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from lamina.outputs import Logprob
from lamina.sampling_params import SamplingParams

DRAFT_ON_DEVICE = -1  # a draft token the worker holds on its device (the module docstring)


@dataclass(slots=True)
class NewRequestData:
    """A request the worker does not hold: everything it needs to run it from now on."""

    req_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # verified outputs so far (a request resumed after preemption recomputes them)
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int]
    block_ids: list[int]
    num_computed_tokens: int


@dataclass(slots=True)
class CachedRequestData:
    """Requests the worker holds, column-wise: row i belongs to req_ids[i]."""

    req_ids: list[str] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)
    block_ids_start: list[int] = field(default_factory=list)  # the worker sets table[start:] = new_block_ids[i]
    new_block_ids: list[list[int]] = field(default_factory=list)

    def append(self, req_id: str, num_computed_tokens: int, start: int, new_block_ids: list[int]) -> None:
        self.req_ids.append(req_id)
        self.num_computed_tokens.append(num_computed_tokens)
        self.block_ids_start.append(start)
        self.new_block_ids.append(new_block_ids)


@dataclass(slots=True)
class Guess:
    """The tokens a step launched on a guess assumes at positions [start, start + len(token_ids)) of a request:
    the drafts of the step before it, all accepted, and the token guessed after them (the input of its first
    row)."""

    start: int
    token_ids: list[int]

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)

    def held_by(self, token_ids: list[int]) -> bool:
        """Whether the request's tokens, once the step before is read, are exactly these up to their end."""
        return len(token_ids) == self.end and token_ids[self.start:] == self.token_ids


@dataclass(slots=True)
class SchedulerOutput:
    """What to compute this step. `req_ids` is the batch in order: request r computes tokens
    [num_computed_tokens, num_computed_tokens + num_scheduled_tokens[r]) of its token ids (drafts after
    the verified tokens) and samples one token if that range reaches the end."""

    req_ids: list[str]
    num_scheduled_tokens: dict[str, int]
    new_reqs: list[NewRequestData] = field(default_factory=list)
    cached_reqs: CachedRequestData = field(default_factory=CachedRequestData)
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    finished_req_ids: list[str] = field(default_factory=list)  # ended since the last message
    preempted_req_ids: list[str] = field(default_factory=list)
    decode_ahead: bool = False
    guesses: dict[str, Guess] = field(default_factory=dict)  # a step launched on a guess (module docstring)
    # worker-side proposers (lamina/spec/model_proposer.py): request id -> at most this many drafts to propose
    # once this step's tokens are known (only requests whose range reaches the end)
    draft_limits: dict[str, int] = field(default_factory=dict)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.req_ids


@dataclass(slots=True)
class PromptLogprobsChunk:
    """Logprobs of prompt tokens [start, start + len(entries)) of one request, computed this step (chunked
    prefill sends a prompt's in pieces; start >= 1: nothing predicts the first prompt token)."""

    start: int
    entries: list[dict[int, Logprob]]


@dataclass(slots=True)
class ModelRunnerOutput:
    """The worker's answer for one step: tokens only for requests whose scheduled range reached the end.

    sampled_token_ids: request id -> its new tokens (a list, so that several accepted drafts fit)
    logprobs: request id -> one {token id: Logprob} per new token, for requests that asked
    failed: request id -> error, for requests whose own part of the step raised (the scheduler ends them
            with finish_reason "error" while the rest of the batch goes on)
    num_compiles: Triton kernels the worker compiled while launching the step (its step stats)
    num_drafts: request id -> how many drafts a worker-side proposer made for the next step (draft_limits),
                held on the worker's device (DRAFT_ON_DEVICE)
    prompt_logprobs: request id -> the prompt logprobs computed this step (SamplingParams.prompt_logprobs)
    """

    sampled_token_ids: dict[str, list[int]]
    logprobs: dict[str, list[dict[int, Logprob]]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    num_compiles: int = 0
    num_drafts: dict[str, int] = field(default_factory=dict)
    prompt_logprobs: dict[str, PromptLogprobsChunk] = field(default_factory=dict)
