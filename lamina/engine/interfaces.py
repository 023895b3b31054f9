"""The typed messages between scheduler and model runner (one engine step)."""
from __future__ import annotations

from dataclasses import dataclass, field

from lamina.engine.request import Request
from lamina.outputs import Logprob


@dataclass
class SchedulerOutput:
    """What to compute this step.

    `requests` is the batch in order; request r computes the tokens
    all_token_ids[r.num_computed_tokens : r.num_computed_tokens + num_scheduled_tokens[id]]
    (drafts appended after the verified tokens), writing their KV into r.block_ids.

    A `decode_ahead` step (Scheduler.schedule_ahead) was scheduled while the step before it was still
    running: request r computes one token at position r.num_tokens, the token that step samples for
    it, which the model runner takes from that step's output on the device.
    """

    requests: list[Request]
    num_scheduled_tokens: dict[str, int]
    preempted_req_ids: list[str] = field(default_factory=list)
    finished_req_ids: list[str] = field(default_factory=list)  # freed since the last step
    decode_ahead: bool = False

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.requests


@dataclass
class ModelRunnerOutput:
    """Tokens produced this step, only for requests whose scheduled chunk reached the end; `failed`: the
    requests whose own part of the step raised (request_id -> the error), which the scheduler ends with
    finish_reason "error" while the rest of the batch goes on."""

    sampled_token_ids: dict[str, list[int]]
    logprobs: dict[str, list[dict[int, Logprob]]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
