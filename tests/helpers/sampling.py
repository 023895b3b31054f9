"""SamplingMetadata for a list of engine Requests, built the way the worker builds it (penalties from the
token lists: the oracle of the worker's incremental PenaltyState)."""
from __future__ import annotations

import torch

from lamina.engine.request import Request
from lamina.layers.sampling_metadata import SamplingMetadata, min_tokens_mask, penalty_tensors


def metadata_for(requests: list[Request], generators: dict[str, torch.Generator], vocab_size: int,
                 device: torch.device, seeds: list[int] | None = None) -> SamplingMetadata:
    params = [r.sampling_params for r in requests]
    rows = {i: generators[r.request_id] for i, r in enumerate(requests) if r.request_id in generators}
    return SamplingMetadata.build(
        params, vocab_size, device, generators=rows, seeds=seeds,
        penalties=penalty_tensors(params, [r.prompt_token_ids for r in requests],
                                  [r.output_token_ids for r in requests], vocab_size, device),
        min_tokens=min_tokens_mask(params, [r.num_output_tokens for r in requests],
                                   [r.eos_token_ids for r in requests], vocab_size, device))
