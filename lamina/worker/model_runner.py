"""ModelRunner: the only place that builds tensors. One call runs one engine step."""
from __future__ import annotations

import torch

from lamina.attention.metadata import set_attention_metadata
from lamina.engine.interfaces import ModelRunnerOutput, SchedulerOutput
from lamina.engine.request import Request
from lamina.layers.sampler import Sampler, SamplerOutput, SamplingMetadata, to_logprob_dicts
from lamina.worker.cuda_graphs import CudaGraphRunner
from lamina.worker.input_batch import HostBatch, plan_batch, to_device


class ModelRunner:
    def __init__(self, model: torch.nn.Module, block_size: int, vocab_size: int, device: torch.device,
                 seed: int) -> None:
        self.model = model
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.device = device
        self.sampler = Sampler(generator=torch.Generator(device).manual_seed(seed))
        self._generators: dict[str, torch.Generator] = {}
        self.graphs: CudaGraphRunner | None = None  # set by the Worker when decode steps are captured

    @torch.inference_mode()
    def execute(self, scheduled: SchedulerOutput) -> ModelRunnerOutput:
        for request_id in scheduled.finished_req_ids:
            self._generators.pop(request_id, None)
        if scheduled.is_empty:
            return ModelRunnerOutput(sampled_token_ids={})
        host = plan_batch(scheduled, self.block_size)
        hidden = self._forward(host)
        if not host.sampling_requests:
            return ModelRunnerOutput(sampled_token_ids={})
        logits = self.model.compute_logits(hidden)
        return self._sample(logits, host.sampling_requests)

    def _forward(self, host: HostBatch) -> torch.Tensor:
        """Hidden states of the rows that sample. Decode-only batches replay a captured graph when
        there is one (every row samples); the rest run eagerly."""
        if self.graphs is not None and self.graphs.can_run(host):
            return self.graphs.run(host)
        batch = to_device(host, self.device)
        with set_attention_metadata(batch.attn_metadata):
            hidden = self.model(batch.input_ids, batch.positions)
        return hidden[batch.logits_indices]

    def _sample(self, logits: torch.Tensor, requests: list[Request]) -> ModelRunnerOutput:
        metadata = SamplingMetadata.from_requests(requests, self._generators_for(requests),
                                                  self.vocab_size, self.device)
        out: SamplerOutput = self.sampler(logits, metadata)
        token_ids = out.sampled_token_ids.tolist()
        sampled = {r.request_id: [t] for r, t in zip(requests, token_ids)}
        logprobs = {}
        if out.logprobs is not None:
            rows = to_logprob_dicts(out.logprobs, token_ids, [r.sampling_params.logprobs for r in requests])
            logprobs = {r.request_id: [row] for r, row in zip(requests, rows) if row is not None}
        return ModelRunnerOutput(sampled_token_ids=sampled, logprobs=logprobs)

    def _generators_for(self, requests: list[Request]) -> dict[str, torch.Generator]:
        """A request with a seed owns a generator for its whole life (so its samples do not
        depend on what it is batched with); it is created the first time the request samples."""
        for request in requests:
            seed = request.sampling_params.seed
            if seed is not None and request.request_id not in self._generators:
                self._generators[request.request_id] = torch.Generator(self.device).manual_seed(seed)
        return self._generators
