"""PendingStep: a launched step whose sampled tokens are still on the device; `result()` is the step's one host
sync (lamina/executor/base.py's StepFuture)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from lamina.layers.sampler import LogprobsTensors, to_logprob_dicts
from lamina.step import ModelRunnerOutput


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """Queue a copy of a device tensor into pinned host memory (CPU tensors are returned as they are)."""
    if t.device.type == "cpu":
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return host.copy_(t, non_blocking=True)


@dataclass
class PendingStep:
    """A launched step: row i of `sampled` is the token of req_ids[i], still on the device; row i of `verified`
    the tokens of verified_req_ids[i] (accepted drafts, then a correction or bonus token; -1 pads), requests
    whose drafts were verified (lamina.layers.rejection_sampler); `failed`: the requests whose sampling raised
    (request_id -> error), in no row. `num_logprobs[i]`: how many logprobs req_ids[i] asked for (None: none).
    `on_result` gets the answer once it is read.

    The copies to the host are queued right behind the step's own work, before any later step is
    launched, so `result()` waits for this step only, not for the one launched after it.
    """

    req_ids: list[str]
    sampled: torch.Tensor | None  # [S] int64 on the device; None when no request samples
    logprobs: LogprobsTensors | None = None
    num_logprobs: list[int | None] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    on_result: Callable[[ModelRunnerOutput], None] | None = None
    num_compiles: int = 0  # Triton compiles while it was launched
    verified_req_ids: list[str] = field(default_factory=list)
    verified: torch.Tensor | None = None  # [N, K + 1] int64 on the device

    def __post_init__(self) -> None:
        self._host_sampled = None if self.sampled is None else _to_host(self.sampled)
        self._host_verified = None if self.verified is None else _to_host(self.verified)
        self._host_logprobs = None
        if self.logprobs is not None:
            fields = dataclasses.fields(self.logprobs)  # (astuple would deep-copy the tensors)
            self._host_logprobs = LogprobsTensors(*(_to_host(getattr(self.logprobs, f.name)) for f in fields))
        self._rows: dict[str, int] | None = None
        self._done = None
        if any(t is not None and t.is_cuda for t in (self.sampled, self.verified)):
            self._done = torch.cuda.Event()
            self._done.record()

    def row_of(self, request_id: str) -> int | None:
        if self._rows is None:
            self._rows = {r: i for i, r in enumerate(self.req_ids)}
        return self._rows.get(request_id)

    def result(self) -> ModelRunnerOutput:
        """Wait for the step and return its tokens (and logprobs) on the host."""
        output = self._read()
        if self.on_result is not None:
            self.on_result(output)
        return output

    def _read(self) -> ModelRunnerOutput:
        if self._host_sampled is None and self._host_verified is None:
            return ModelRunnerOutput(sampled_token_ids={}, failed=self.failed, num_compiles=self.num_compiles)
        if self._done is not None:
            self._done.synchronize()
        token_ids = [] if self._host_sampled is None else self._host_sampled.tolist()
        sampled = {r: [t] for r, t in zip(self.req_ids, token_ids)}
        if self._host_verified is not None:
            for req_id, row in zip(self.verified_req_ids, self._host_verified.tolist()):
                sampled[req_id] = [t for t in row if t >= 0]
        logprobs = {}
        if self._host_logprobs is not None:
            rows = to_logprob_dicts(self._host_logprobs, token_ids, self.num_logprobs)
            logprobs = {r: [row] for r, row in zip(self.req_ids, rows) if row is not None}
        return ModelRunnerOutput(sampled_token_ids=sampled, logprobs=logprobs, failed=self.failed,
                                 num_compiles=self.num_compiles)
