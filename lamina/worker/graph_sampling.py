"""What a step's CUDA graph samples (lamina/worker/cuda_graphs.py, SlotSampling): the rows' keys and parameters,
built before the replay exactly as the model runner keys its sampling calls after one, so that a graph's draws
equal the eager engine's.

    a step's logits rows, in order:   request a (k = 2 drafts)   request b (none)   request c (k = 1)
                                      rows 0 1 2                 row 3              rows 4 5
    sampling calls (ModelRunner):     1. the drafting rows 0 1 2 4 5, keyed by each request's seed or salt (verify)
                                      2. the plain rows 3, keyed by the request's seed or the step's key
    each call that draws (not every row greedy) takes one fresh step key, in that order
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from lamina.layers.sampler import SamplerOutput, compute_logprobs
from lamina.layers.sampling_metadata import philox_keys
from lamina.sampling_params import SamplingParams
from lamina.spec.draft_tree import DraftTree
from lamina.worker.batch_state import RequestState
from lamina.worker.cuda_graphs import SlotSampling
from lamina.worker.input_batch import HostBatch

SamplingCall = tuple[list[int], list[str], list[int], bool]  # logits rows, the request of each, its position, salted


def slot_sampling(host: HostBatch, held: Mapping[str, RequestState], vocab_size: int, tree: DraftTree | None,
                  step_key: Callable[[], int]) -> SlotSampling | None:
    """Each logits row's key, temperature, top-p and min-p at its slot, call by call (the module docstring;
    `step_key` draws the next step key). None (the step samples after the replay) if a row needs more (top-k,
    penalties, min_tokens: its logits change first), or if every row is greedy (the graph's argmax)."""
    params = [held[r].sampling_params for r in host.sampling_req_ids]
    if all(p.greedy for p in params) or not all(samples_in_graph(p, held[r].num_output_tokens, vocab_size)
                                                for r, p in zip(host.sampling_req_ids, params)):
        return None
    num_rows = len(params) + sum(host.num_draft_tokens)
    keys, row_params = [0] * num_rows, [params[0]] * num_rows
    for rows, req_ids, positions, salted in sampling_calls(host, tree):
        call_params = [held[r].sampling_params for r in req_ids]
        for row, p in zip(rows, call_params):
            row_params[row] = p
        if not req_ids or all(p.greedy for p in call_params):
            continue  # a call that draws nothing takes no step key (ModelRunner._philox_keys)
        seeds = [held[r].seed if salted else p.seed for r, p in zip(req_ids, call_params)]
        for row, key in zip(rows, philox_keys(seeds, positions, step_key())):
            keys[row] = key
    return SlotSampling(slots=host.logits_indices[:num_rows], keys=keys,
                        temperature=[0.0 if p.greedy else p.temperature for p in row_params],
                        top_p=[1.0 if p.greedy else p.top_p for p in row_params],
                        min_p=[0.0 if p.greedy else p.min_p for p in row_params])


def sampling_calls(host: HostBatch, tree: DraftTree | None) -> list[SamplingCall]:
    """The step's sampling calls in the order the model runner makes them (the module docstring)."""
    plain, plain_rows, spec, spec_rows, num_drafts = split_by_drafts(host.sampling_req_ids, host.num_draft_tokens)
    positions = [p for p, k in zip(host.sample_positions, host.num_draft_tokens) if k]
    verify_rows = [r for r, k in zip(spec, num_drafts) for _ in range(k + 1)]
    plain_positions = [p for p, k in zip(host.sample_positions, host.num_draft_tokens) if not k]
    return [(spec_rows, verify_rows, verify_positions(positions, num_drafts, tree), True),
            (plain_rows, plain, plain_positions, False)]


def verify_positions(positions: list[int], num_drafts: list[int], tree: DraftTree | None) -> list[int]:
    """The position each verify row samples: request i's rows sample positions[i] + 0..k (a chain), or + the depth
    of each tree node."""
    offsets = (lambda k: range(k + 1)) if tree is None else (lambda k: (0, *tree.depths[:k]))
    return [p + j for p, k in zip(positions, num_drafts) for j in offsets(k)]


def samples_in_graph(params: SamplingParams, num_output_tokens: int, vocab_size: int) -> bool:
    """Whether a row's token can be drawn inside a CUDA graph (the sampling kernel's temperature, top-p and min-p
    only): no top-k below the vocabulary, no penalties, no min_tokens still to reach."""
    return (not params.has_penalties and num_output_tokens >= params.min_tokens
            and (params.greedy or params.top_k <= 0 or params.top_k >= vocab_size))


def graph_sampled(logits: torch.Tensor, sampled: torch.Tensor, num_logprobs: list[int | None]) -> SamplerOutput:
    """The tokens a graph sampled (copied: the next replay rewrites its buffer), with the rows' logprobs from their
    raw logits (`num_logprobs`: each row's ask), as the Sampler computes them."""
    tokens = sampled.clone()
    asked = [n for n in num_logprobs if n is not None]
    logprobs = compute_logprobs(logits, tokens, max(asked)) if asked else None
    return SamplerOutput(sampled_token_ids=tokens, logprobs=logprobs)


def split_by_drafts(req_ids: list[str], num_drafts: list[int]
                    ) -> tuple[list[str], list[int], list[str], list[int], list[int]]:
    """(requests without drafts, their logits rows, requests with drafts, their k + 1 rows each, their k)."""
    plain, plain_rows, spec, spec_rows, spec_k = [], [], [], [], []
    row = 0
    for req_id, k in zip(req_ids, num_drafts):
        if k:
            spec.append(req_id)
            spec_rows.extend(range(row, row + k + 1))
            spec_k.append(k)
        else:
            plain.append(req_id)
            plain_rows.append(row)
        row += k + 1
    return plain, plain_rows, spec, spec_rows, spec_k
