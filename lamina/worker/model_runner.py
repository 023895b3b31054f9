"""ModelRunner: the only place that builds tensors. One call launches one engine step.

`launch` queues a step's work on the device and returns a `PendingStep`, whose sampled tokens stay on
the device until `result()` reads them (the step's one host sync). A `decode_ahead` step is launched
before the previous step's result is read: its input ids are that step's samples, copied on the device.
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

import numpy as np
import torch

from lamina.attention.metadata import set_attention_metadata
from lamina.failures import is_fatal
from lamina.engine.interfaces import ModelRunnerOutput, SchedulerOutput
from lamina.engine.request import Request
from lamina.layers.sampler import (LogprobsTensors, Sampler, SamplerOutput, SamplingMetadata, to_logprob_dicts,
                                   uses_sampling_kernel)
from lamina.layers.sampling_metadata import philox_keys
from lamina.worker.cuda_graphs import CudaGraphRunner
from lamina.worker.input_batch import HostBatch, plan_batch, to_device


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """Queue a copy of a device tensor into pinned host memory (CPU tensors are returned as they are)."""
    if t.device.type == "cpu":
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return host.copy_(t, non_blocking=True)


def _select_rows(t: torch.Tensor, rows: list[int], device: torch.device) -> torch.Tensor:
    """t[rows]: a view when rows are 0..n-1 (the usual step), else one index copy."""
    if rows == list(range(len(rows))):
        return t[:len(rows)]
    return t.index_select(0, torch.from_numpy(np.array(rows, dtype=np.int64)).to(device, non_blocking=True))


@dataclass
class PendingStep:
    """A launched step: row i of `sampled` is the token of requests[i], still on the device; `failed`:
    the requests whose sampling raised (request_id -> error), in no row.

    The copies to the host are queued right behind the step's own work, before any later step is
    launched, so `result()` waits for this step only, not for the one launched after it.
    """

    requests: list[Request]
    sampled: torch.Tensor | None  # [S] int64 on the device; None when no request samples
    logprobs: LogprobsTensors | None = None
    failed: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._host_sampled = None if self.sampled is None else _to_host(self.sampled)
        self._host_logprobs = None
        if self.logprobs is not None:
            fields = dataclasses.fields(self.logprobs)  # (astuple would deep-copy the tensors)
            self._host_logprobs = LogprobsTensors(*(_to_host(getattr(self.logprobs, f.name)) for f in fields))
        self._rows: dict[str, int] | None = None
        self._done = None
        if self.sampled is not None and self.sampled.is_cuda:
            self._done = torch.cuda.Event()
            self._done.record()

    def row_of(self, request_id: str) -> int | None:
        if self._rows is None:
            self._rows = {r.request_id: i for i, r in enumerate(self.requests)}
        return self._rows.get(request_id)

    def result(self) -> ModelRunnerOutput:
        """Wait for the step and return its tokens (and logprobs) on the host."""
        if self._host_sampled is None:
            return ModelRunnerOutput(sampled_token_ids={}, failed=self.failed)
        if self._done is not None:
            self._done.synchronize()
        token_ids = self._host_sampled.tolist()
        sampled = {r.request_id: [t] for r, t in zip(self.requests, token_ids)}
        logprobs = {}
        if self._host_logprobs is not None:
            rows = to_logprob_dicts(self._host_logprobs, token_ids,
                                    [r.sampling_params.logprobs for r in self.requests])
            logprobs = {r.request_id: [row] for r, row in zip(self.requests, rows) if row is not None}
        return ModelRunnerOutput(sampled_token_ids=sampled, logprobs=logprobs, failed=self.failed)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, block_size: int, vocab_size: int, device: torch.device,
                 seed: int) -> None:
        self.model = model
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.device = device
        self.sampler = Sampler(generator=torch.Generator(device).manual_seed(seed))
        self._generators: dict[str, torch.Generator] = {}
        self._step_keys = random.Random(seed)  # keys of the rows without a seed, fresh every step
        self.kernel_sampling = uses_sampling_kernel(device)  # the one place that picks the sampling path
        self.graphs: CudaGraphRunner | None = None  # set by the Worker when decode steps are captured


    @torch.inference_mode()
    def launch(self, scheduled: SchedulerOutput, previous: PendingStep | None = None) -> PendingStep:
        """Queue the step on the device. A decode_ahead step needs `previous`, the step it follows."""
        for request_id in scheduled.finished_req_ids:
            self._generators.pop(request_id, None)
        if scheduled.is_empty:
            return PendingStep([], None)
        host = plan_batch(scheduled, self.block_size)
        ahead_ids = self._ahead_input_ids(scheduled, previous) if scheduled.decode_ahead else None
        hidden = self._forward(host, ahead_ids)
        if not host.sampling_requests:
            return PendingStep([], None)
        logits = self.model.compute_logits(hidden)
        requests, keys = host.sampling_requests, self._philox_keys(host)
        try:
            out = self._sample(logits, requests, keys)
        except Exception as err:  # noqa: BLE001 - one row's failure must not fail the batch
            if is_fatal(err):
                raise
            return self._sample_isolating(logits, requests, keys, err)
        return PendingStep(requests, out.sampled_token_ids, out.logprobs)

    def _sample(self, logits: torch.Tensor, requests: list[Request], keys: list[int] | None) -> SamplerOutput:
        generators = {} if keys is not None else self._generators_for(requests)  # the torch path's
        metadata = SamplingMetadata.from_requests(requests, generators, self.vocab_size, self.device, keys)
        return self.sampler(logits, metadata)

    def _sample_isolating(self, logits: torch.Tensor, requests: list[Request], keys: list[int] | None,
                          err: Exception) -> PendingStep:
        """The batch's sampling raised: the rows that raise alone fail (PendingStep.failed), the others are
        sampled together again. If no row raises alone the batch is at fault: `err` is raised again.
        (Only on this path, a seeded row's CPU generator may advance more than once for one token.)"""
        failed: dict[str, str] = {}
        for row, request in enumerate(requests):
            try:
                self._sample(logits[row:row + 1], [request], None if keys is None else keys[row:row + 1])
            except Exception as row_err:  # noqa: BLE001 - this row's request ends with the error
                if is_fatal(row_err):
                    raise
                failed[request.request_id] = f"sampling failed: {row_err!r}"
        if not failed:
            raise err
        rows = [i for i, r in enumerate(requests) if r.request_id not in failed]
        if not rows:
            return PendingStep([], None, failed=failed)
        kept = [requests[i] for i in rows]
        out = self._sample(_select_rows(logits, rows, self.device), kept,
                           None if keys is None else [keys[i] for i in rows])
        return PendingStep(kept, out.sampled_token_ids, out.logprobs, failed=failed)

    def _ahead_input_ids(self, scheduled: SchedulerOutput, previous: PendingStep | None) -> torch.Tensor:
        """The tokens `previous` samples for the requests of a decode_ahead step, in batch order."""
        if previous is None or previous.sampled is None:
            raise ValueError("a decode_ahead step needs the pending step it follows")
        rows = [previous.row_of(r.request_id) for r in scheduled.requests]
        if None in rows:
            raise ValueError("a decode_ahead request does not sample in the pending step")
        return _select_rows(previous.sampled, rows, self.device)

    def _forward(self, host: HostBatch, ahead_ids: torch.Tensor | None) -> torch.Tensor:
        """Hidden states of the rows that sample. Decode-only batches replay a captured graph when
        there is one; the rest run eagerly. `ahead_ids` overwrite the input ids."""
        if self.graphs is not None and self.graphs.can_run(host):
            # all rows, unless a one-token prompt chunk rides among the decodes (it samples nothing)
            return _select_rows(self.graphs.run(host, ahead_ids), host.logits_indices, self.device)
        batch = to_device(host, self.device)
        if ahead_ids is not None:
            batch.input_ids.copy_(ahead_ids)
        with set_attention_metadata(batch.attn_metadata):
            hidden = self.model(batch.input_ids, batch.positions)
        return hidden[batch.logits_indices]

    def _philox_keys(self, host: HostBatch) -> list[int] | None:
        """Per-row keys of the sampling kernel (lamina.layers.sampler); None when it is not used: on the
        torch path (CPU, or no triton) and in all-greedy steps (an argmax draws nothing)."""
        if not self.kernel_sampling or all(r.sampling_params.greedy for r in host.sampling_requests):
            return None
        return philox_keys(host.sampling_requests, host.sample_positions, self._step_keys.getrandbits(63))

    def _generators_for(self, requests: list[Request]) -> dict[str, torch.Generator]:
        """A request with a seed owns a generator for its whole life (so its samples do not
        depend on what it is batched with); it is created the first time the request samples.
        Any integer is a seed: torch takes 64 bits, so it gets `seed mod 2**64` (the key the CUDA
        sampling kernel uses too, lamina.layers.sampling_metadata.philox_keys; the same generator as
        before for every seed in [-2**63, 2**64))."""
        for request in requests:
            seed = request.sampling_params.seed
            if seed is not None and request.request_id not in self._generators:
                self._generators[request.request_id] = torch.Generator(self.device).manual_seed(seed % 2**64)
        return self._generators
