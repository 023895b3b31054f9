"""Prompt logprobs (SamplingParams.prompt_logprobs) on the worker: the scored rows of a step, split off the
hidden states after the forward and turned into logprobs on the device; read back with the step's tokens.

    hidden [S + R, H]:  rows 0..S-1 sample (the model runner's usual rows), rows S.. score prompt tokens
                        (PromptRows, lamina/worker/input_batch.py): row j's logits give the logprob of the
                        prompt token that follows its position, and the top-N of that distribution

Logits are computed ROWS_PER_SLICE rows at a time, so a long prompt chunk never holds [chunk, vocab] float32
logits and their log_softmax at once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lamina.layers.sampler import LogprobsTensors, compute_logprobs, to_logprob_dicts
from lamina.step import PromptLogprobsChunk
from lamina.worker.input_batch import HostBatch, PromptRows

ROWS_PER_SLICE = 1024


@dataclass
class PromptLogprobsResult:
    """The scored rows of one step: on the device until `read` (after the step's host sync)."""

    rows: PromptRows
    logprobs: LogprobsTensors

    def read(self) -> dict[str, PromptLogprobsChunk]:
        """Request id -> its chunk of prompt logprobs (the tensors must be on the host, or readable)."""
        rows = self.rows
        dicts = to_logprob_dicts(self.logprobs, rows.target_ids,
                                 [n for n, count in zip(rows.num_logprobs, rows.counts) for _ in range(count)])
        out, offset = {}, 0
        for req_id, start, count in zip(rows.req_ids, rows.starts, rows.counts):
            out[req_id] = PromptLogprobsChunk(start, dicts[offset:offset + count])
            offset += count
        return out


def split_prompt_rows(model: torch.nn.Module, hidden: torch.Tensor,
                      host: HostBatch) -> tuple[torch.Tensor, PromptLogprobsResult | None]:
    """(the sampling rows of `hidden`, the step's prompt logprobs or None when no row scores a prompt)."""
    rows = host.prompt_rows
    if rows is None:
        return hidden, None
    num_sampling = len(host.logits_indices) - len(rows.flat_indices)
    scored = hidden[num_sampling:]
    targets = torch.tensor(rows.target_ids, dtype=torch.int64).to(hidden.device, non_blocking=True)
    top = max(rows.num_logprobs)
    parts = [compute_logprobs(model.compute_logits(scored[i:i + ROWS_PER_SLICE]), targets[i:i + ROWS_PER_SLICE],
                              top) for i in range(0, scored.shape[0], ROWS_PER_SLICE)]
    logprobs = parts[0] if len(parts) == 1 else LogprobsTensors(
        *(torch.cat([getattr(p, name) for p in parts]) for name in
          ("top_ids", "top_logprobs", "sampled_logprob", "sampled_rank")))
    return hidden[:num_sampling], PromptLogprobsResult(rows, logprobs)
