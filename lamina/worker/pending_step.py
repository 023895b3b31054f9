"""PendingStep: a launched step whose sampled tokens are still on the device; `result()` is the step's one host
sync (lamina/executor/base.py's StepFuture)."""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from lamina.device import to_host_async
from lamina.layers.accept_drafts import accept_drafts
from lamina.layers.sampler import LogprobsTensors, to_logprob_dicts
from lamina.spec.draft_tree import DraftTree
from lamina.step import ModelRunnerOutput
from lamina.worker.prompt_logprobs import PromptLogprobsResult


@dataclass
class Verified:
    """The requests of a step whose drafts were verified: request i's k_i + 1 rows of `sampled` (one sample each,
    on the device until read) and its k_i drafts in `draft_ids` (flat; on the device too when the drafter made
    them); reading keeps the drafts that equal their samples and one sample more (lamina.layers.accept_drafts), or,
    with a `tree`, the path the samples take through it (DraftTree.walk), which `on_paths` then gets (request id ->
    its accepted nodes: their KV moves to the slots of their positions). `logprobs` (when a request asked) has one
    row per sampled row."""

    req_ids: list[str]
    sampled: torch.Tensor  # [sum(k_i + 1)] int64
    num_drafts: list[int]
    draft_ids: list[int] | torch.Tensor
    logprobs: LogprobsTensors | None = None
    num_logprobs: list[int | None] = field(default_factory=list)  # per request
    tree: DraftTree | None = None
    on_paths: Callable[[dict[str, list[int]]], None] | None = None

    def to_host(self) -> Verified:
        draft_ids = self.draft_ids if isinstance(self.draft_ids, list) else to_host_async(self.draft_ids)
        return dataclasses.replace(self, sampled=to_host_async(self.sampled), draft_ids=draft_ids,
                                   logprobs=_logprobs_to_host(self.logprobs))

    def read(self, sampled: dict[str, list[int]], logprobs: dict[str, list]) -> None:
        """Add each request's tokens (and the logprobs of each) to the answer's dicts (host tensors)."""
        rows = self.sampled.tolist()
        draft_ids = self.draft_ids if isinstance(self.draft_ids, list) else self.draft_ids.tolist()
        emitted_rows = self._emitted_rows(rows, draft_ids)
        sampled.update((r, [rows[i] for i in emitted]) for r, emitted in zip(self.req_ids, emitted_rows))
        if self.logprobs is None:
            return
        per_row = [n for n, k in zip(self.num_logprobs, self.num_drafts) for _ in range(k + 1)]
        dicts = to_logprob_dicts(self.logprobs, rows, per_row)
        for req_id, emitted, asked in zip(self.req_ids, emitted_rows, self.num_logprobs):
            if asked is not None:
                logprobs[req_id] = [dicts[i] for i in emitted]

    def _emitted_rows(self, rows: list[int], draft_ids: list[int]) -> list[list[int]]:
        """Each request's rows whose samples it emits, in order."""
        if self.tree is None:
            starts = itertools.accumulate((k + 1 for k in self.num_drafts), initial=0)
            tokens = accept_drafts(rows, self.num_drafts, draft_ids)
            return [list(range(start, start + len(t))) for start, t in zip(starts, tokens)]
        emitted, paths, row, flat = [], {}, 0, 0
        for req_id, k in zip(self.req_ids, self.num_drafts):
            path = self.tree.walk(rows[row:row + k + 1], draft_ids[flat:flat + k], k)
            emitted.append([row] + [row + 1 + node for node in path])
            paths[req_id] = path
            row, flat = row + k + 1, flat + k
        if self.on_paths is not None:
            self.on_paths(paths)
        return emitted


def _logprobs_to_host(logprobs: LogprobsTensors | None) -> LogprobsTensors | None:
    if logprobs is None:
        return None
    fields = dataclasses.fields(logprobs)  # (astuple would deep-copy the tensors)
    return LogprobsTensors(*(to_host_async(getattr(logprobs, f.name)) for f in fields))


@dataclass
class PendingStep:
    """A launched step: row i of `sampled` is the token of req_ids[i], still on the device; `verified`: the
    requests whose drafts were verified, with their tokens; `failed`: the requests whose sampling raised
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
    verified: Verified | None = None

    def __post_init__(self) -> None:
        self._host_sampled = None if self.sampled is None else to_host_async(self.sampled)
        self._host_verified = None if self.verified is None else self.verified.to_host()
        self._host_logprobs = _logprobs_to_host(self.logprobs)
        self._rows: dict[str, int] | None = None
        self._host_prompt: PromptLogprobsResult | None = None
        self._done = None
        verified_tokens = None if self.verified is None else self.verified.sampled
        if any(t is not None and t.is_cuda for t in (self.sampled, verified_tokens)):
            self._done = torch.cuda.Event()
            self._done.record()

    def add_prompt_logprobs(self, result: PromptLogprobsResult | None) -> None:
        """Carry the step's prompt logprobs (their copy to the host is queued now; read with the tokens)."""
        if result is None:
            return
        self._host_prompt = dataclasses.replace(result, logprobs=_logprobs_to_host(result.logprobs))
        if result.logprobs.sampled_logprob.is_cuda:
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
        if self._done is not None:
            self._done.synchronize()
        prompt = {} if self._host_prompt is None else self._host_prompt.read()
        if self._host_sampled is None and self._host_verified is None:
            return ModelRunnerOutput(sampled_token_ids={}, failed=self.failed, num_compiles=self.num_compiles,
                                     prompt_logprobs=prompt)
        token_ids = [] if self._host_sampled is None else self._host_sampled.tolist()
        sampled = {r: [t] for r, t in zip(self.req_ids, token_ids)}
        logprobs = {}
        if self._host_logprobs is not None:
            rows = to_logprob_dicts(self._host_logprobs, token_ids, self.num_logprobs)
            logprobs = {r: [row] for r, row in zip(self.req_ids, rows) if row is not None}
        if self._host_verified is not None:
            self._host_verified.read(sampled, logprobs)
        return ModelRunnerOutput(sampled_token_ids=sampled, logprobs=logprobs, failed=self.failed,
                                 num_compiles=self.num_compiles, prompt_logprobs=prompt)
