"""Flatten one SchedulerOutput into the tensors a forward needs.

    request r, scheduled q tokens, context c = num_computed_tokens:
      input_ids   += tokens[c : c + q]          positions += [c, c + q)
      slot_mapping += block_ids[p // bs] * bs + p % bs   for p in [c, c + q)
      seq_lens    += c + q
      logits index = last flattened token of r, only if c + q reaches the end of r's tokens
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lamina.attention.metadata import AttentionMetadata
from lamina.engine.interfaces import SchedulerOutput
from lamina.engine.request import Request


@dataclass
class InputBatch:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    attn_metadata: AttentionMetadata
    logits_indices: torch.Tensor  # [S]: rows of the hidden states to turn into logits
    sampling_requests: list[Request]  # the S requests that sample a token this step


def _token_slice(request: Request, start: int, end: int) -> list[int]:
    tokens = request.all_token_ids
    if end <= len(tokens):
        return tokens[start:end]
    return (tokens + request.spec_token_ids)[start:end]


def build_input_batch(scheduled: SchedulerOutput, block_size: int, device: torch.device) -> InputBatch:
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start = [0]
    seq_lens: list[int] = []
    logits_indices: list[int] = []
    sampling: list[Request] = []
    for request in scheduled.requests:
        start = request.num_computed_tokens
        end = start + scheduled.num_scheduled_tokens[request.request_id]
        input_ids += _token_slice(request, start, end)
        blocks = request.block_ids
        for pos in range(start, end):
            positions.append(pos)
            slots.append(blocks[pos // block_size] * block_size + pos % block_size)
        query_start.append(len(input_ids))
        seq_lens.append(end)
        if end >= request.num_tokens:
            logits_indices.append(len(input_ids) - 1)
            sampling.append(request)
    max_blocks = max(len(r.block_ids) for r in scheduled.requests)
    tables = [r.block_ids + [0] * (max_blocks - len(r.block_ids)) for r in scheduled.requests]
    metadata = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(query_start, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
        max_query_len=max(b - a for a, b in zip(query_start, query_start[1:])),
        max_seq_len=max(seq_lens),
        query_start_loc_cpu=query_start,
        seq_lens_cpu=seq_lens,
    )
    return InputBatch(
        input_ids=torch.tensor(input_ids, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        attn_metadata=metadata,
        logits_indices=torch.tensor(logits_indices, dtype=torch.int64, device=device),
        sampling_requests=sampling,
    )
