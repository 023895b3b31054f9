"""Request: token ids, the two counters the scheduler drives, and per-request state.

    all_token_ids:  | prompt ........ | output (verified) | spec (drafts, transient) |
                    0                                     ^ num_tokens
    KV present for: [0, num_computed_tokens)

Each step the scheduler hands out tokens so that num_computed_tokens catches up with
num_tokens (+ drafts). Rejected drafts are rolled back by lowering num_computed_tokens.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from lamina.outputs import PromptLogprobs, RequestMetrics, SampleLogprobs
from lamina.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"  # a step failed for this request (lamina/failures.py); its blocks are freed

    @property
    def finished(self) -> bool:
        return self in _FINISHED


_FINISHED = frozenset({RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED,
                       RequestStatus.FINISHED_ERROR})


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()
    prompt: str | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    parent: Request | None = None  # n > 1: sample 0, whose prompt KV this sample shares
    sample_index: int = 0

    output_token_ids: list[int] = field(default_factory=list)
    spec_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None
    error: str | None = None  # why it ended with FINISHED_ERROR
    logprobs: SampleLogprobs | None = None
    cumulative_logprob: float = 0.0
    prompt_logprobs: PromptLogprobs | None = None  # filled chunk by chunk (lamina/engine/prompt_logprobs.py)
    metrics: RequestMetrics = field(init=False)
    _all_token_ids: list[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.metrics = RequestMetrics(arrival_time=self.arrival_time)
        self._all_token_ids = list(self.prompt_token_ids)
        if self.sampling_params.logprobs is not None:
            self.logprobs = []
        if self.sampling_params.prompt_logprobs is not None:
            self.prompt_logprobs = [None]

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt + verified output tokens (a live list: do not mutate)."""
        return self._all_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self._all_token_ids) + len(self.spec_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    @property
    def finish_reason(self) -> str | None:
        return self.status.value if self.status.finished else None

    def append_output_token_ids(self, token_ids: list[int]) -> None:
        self.output_token_ids.extend(token_ids)
        self._all_token_ids.extend(token_ids)

    def truncate_output(self, num_output_tokens: int) -> None:
        """Keep the first `num_output_tokens` outputs: a stop string ended the text inside a run of accepted
        drafts, and the tokens after it are not part of the output (nor of its logprobs or counts)."""
        drop = self.num_output_tokens - num_output_tokens
        if drop <= 0:
            return
        if self.logprobs is not None:
            dropped = zip(self.output_token_ids[num_output_tokens:], self.logprobs[num_output_tokens:])
            self.cumulative_logprob -= sum(entry[token].logprob for token, entry in dropped)
            del self.logprobs[num_output_tokens:]
        del self.output_token_ids[num_output_tokens:]
        del self._all_token_ids[-drop:]
        self.metrics.num_generation_tokens = num_output_tokens
