"""RejectionSampler: verify speculative drafts so that the output follows the target distribution exactly.

Layout of one step (request i has k_i drafts x_i0 .. x_i(k_i-1); R = sum(k_i + 1) logits rows, D = sum k_i):

    logits rows   │ r0: x_00? │ r1: x_01? │ r2: bonus │ r3: bonus │ r4: x_20? │ r5: bonus │
    request       │ 0 (k = 2)                         │ 1 (k = 0) │ 2 (k = 1)             │
    draft rows    │ d0        │ d1        │                       │ d2        │

Row j of a request is the target's distribution of the token at draft j's position, the last row the one
after all its drafts. The output has one row per request, K = max k_i:

    token_ids[i]  = [x_i0 .. x_i(a-1), t, -1, ..., -1]   (K + 1 entries), num_accepted[i] = a

where a is the number of leading drafts accepted and t comes from row a: the correction of the first
rejected draft, or the bonus token when all k_i were accepted.

Greedy requests: draft j is accepted while it equals argmax(row j); t = argmax(row a).
Random requests (Leviathan et al. 2023): p_j = row j after temperature, top-k, top-p, min-p (the
Sampler's torch path), q_j = the draft distribution x_j was sampled from. Draft j is accepted with
probability min(1, p_j(x_j) / q_j(x_j)); a rejected draft is replaced by a sample of
norm(max(0, p_j - q_j)); all accepted: t ~ p_k. Without `draft_probs` q_j is one-hot on x_j (n-gram
drafts): accept with probability p_j(x_j), replace by a sample of p_j with x_j removed. Either way the
emitted tokens are distributed exactly as if sampled one by one from the target.

Randomness: a uniform per draft and one exponential race (as in the Sampler) per row. A seeded request
(metadata.generators) draws, from its own generator and in this order, its k_i uniforms, then its rows'
exponentials row by row, every step, whatever was accepted: its tokens do not depend on the batch. A
request with no drafts draws exactly what the Sampler would.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import nn

from lamina.layers.sampler import exponential_race, random_probs
from lamina.layers.sampling_metadata import SamplingMetadata, host_to_device

__all__ = ["RejectionSampler", "VerifyOutput"]


@dataclass
class VerifyOutput:
    token_ids: torch.Tensor  # [N, K + 1] int64: accepted drafts, then the correction or bonus token, then -1
    num_accepted: torch.Tensor  # [N] int64: drafts accepted, 0..k_i (request i emits num_accepted[i] + 1 tokens)


@dataclass
class _Layout:
    """Index tensors of a step, built on the host from `num_draft_tokens` and copied at once (no sync)."""

    request_of_row: torch.Tensor  # [R] the request of each logits row
    draft_rows: torch.Tensor  # [D] the logits row of each draft
    draft_slots: torch.Tensor  # [D] i * K + j: each draft's place in an [N, K] matrix
    first_rows: torch.Tensor  # [N] each request's first logits row
    max_drafts: int  # K

    @classmethod
    def build(cls, num_draft_tokens: list[int], device: torch.device) -> _Layout:
        k = torch.tensor(num_draft_tokens, dtype=torch.int64)
        n, width = k.numel(), max(num_draft_tokens, default=0)
        first_rows = torch.cumsum(k + 1, 0) - (k + 1)
        request_of_draft = torch.repeat_interleave(torch.arange(n), k)
        j = torch.arange(int(k.sum())) - (torch.cumsum(k, 0) - k)[request_of_draft]
        parts = [torch.repeat_interleave(torch.arange(n), k + 1), first_rows[request_of_draft] + j,
                 request_of_draft * width + j, first_rows]
        moved = host_to_device(torch.cat(parts), torch.int64, device).split([p.numel() for p in parts])
        return cls(*moved, max_drafts=width)


class RejectionSampler(nn.Module):
    """Verification of draft tokens (see the module docstring for the layouts and the rule).

    `generator` is the shared generator of the rows without a seed (None: torch's default RNG); it must
    live on the logits' device. Penalties and min_tokens are not supported: the engine does not draft for
    requests that use them (their logits would depend on the drafts accepted before), and a metadata that
    has them is a ValueError; so is one keyed for the sampling kernel (`seeds`): this is the torch path.
    Logprobs are the caller's, from the raw logits rows.
    """

    def __init__(self, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.generator = generator

    def forward(self, logits: torch.Tensor, num_draft_tokens: list[int], draft_token_ids: torch.Tensor,
                metadata: SamplingMetadata, draft_probs: torch.Tensor | None = None) -> VerifyOutput:
        """`logits` [R, V] float32 (not modified), `draft_token_ids` [D] int64, `metadata` one row per
        request, `draft_probs` [D, V] (None: one-hot drafts)."""
        _validate(logits, num_draft_tokens, draft_token_ids, metadata, draft_probs)
        layout = _Layout.build(num_draft_tokens, logits.device)
        drafts = draft_token_ids.to(torch.int64)
        greedy = logits.argmax(dim=-1)  # [R]
        if metadata.all_greedy:  # no softmax, no randomness
            return _assemble(greedy[layout.draft_rows] == drafts, greedy, drafts, layout)
        probs = random_probs(logits, _expand(metadata, layout.request_of_row))
        probs = probs / probs.sum(dim=-1, keepdim=True)
        accepted, tokens = self._verify_random(probs, drafts, draft_probs, num_draft_tokens, metadata, layout)
        if metadata.greedy_mask is not None:
            greedy_rows = metadata.greedy_mask[layout.request_of_row]
            tokens = torch.where(greedy_rows, greedy, tokens)
            accepted = torch.where(greedy_rows[layout.draft_rows], greedy[layout.draft_rows] == drafts, accepted)
        return _assemble(accepted, tokens, drafts, layout)

    def _verify_random(self, probs: torch.Tensor, drafts: torch.Tensor, draft_probs: torch.Tensor | None,
                       num_draft_tokens: list[int], metadata: SamplingMetadata,
                       layout: _Layout) -> tuple[torch.Tensor, torch.Tensor]:
        """([D] accepted, [R] the token each row would emit: its correction, or for bonus rows a sample of p).
        `probs` (normalised, ours) becomes each row's emission distribution in place."""
        rows = layout.draft_rows
        target = probs[rows, drafts]  # p_j(x_j)
        if draft_probs is None:
            proposal = torch.ones_like(target)
            probs[rows, drafts] = 0.0  # p_j without x_j
            exhausted = None  # p_j has mass outside x_j whenever a rejection is possible
        else:
            proposal = draft_probs.gather(1, drafts.unsqueeze(1)).squeeze(1).to(probs.dtype)
            residual = (probs[rows] - draft_probs).clamp_(min=0.0)
            exhausted = residual.sum(dim=-1) <= 0  # p <= q everywhere: p == q, a rejection is impossible
            probs[rows] = residual
        uniforms, generators = self._draw_uniforms(target, num_draft_tokens, metadata)
        accepted = uniforms * proposal < target  # u < p / q without dividing by q = 0
        if exhausted is not None:
            accepted |= exhausted
        return accepted, exponential_race(probs, generators, self.generator)

    def _draw_uniforms(self, like: torch.Tensor, num_draft_tokens: list[int],
                       metadata: SamplingMetadata) -> tuple[torch.Tensor, dict[int, torch.Generator]]:
        """[D] uniforms in [0, 1), and the row -> generator map of the race; seeded requests draw their
        uniforms first (the race comes after), each from its own generator."""
        uniforms = torch.empty_like(like)
        if len(metadata.generators) < len(num_draft_tokens):
            uniforms.uniform_(generator=self.generator)
        first_draft = [0, *itertools.accumulate(num_draft_tokens)]
        row_generators: dict[int, torch.Generator] = {}
        for request, gen in sorted(metadata.generators.items()):
            k, first_row = num_draft_tokens[request], first_draft[request] + request
            if k:
                uniforms[first_draft[request]:first_draft[request] + k].uniform_(generator=gen)
            row_generators.update((row, gen) for row in range(first_row, first_row + k + 1))
        return uniforms, row_generators


def _assemble(accepted: torch.Tensor, tokens: torch.Tensor, drafts: torch.Tensor, layout: _Layout) -> VerifyOutput:
    """Leading accepted drafts, then tokens[first row + num_accepted], then -1 (module docstring)."""
    n, width = layout.first_rows.numel(), layout.max_drafts
    matrix = torch.zeros(n * width, dtype=torch.bool, device=accepted.device)
    matrix[layout.draft_slots] = accepted
    num_accepted = matrix.view(n, width).to(torch.int64).cumprod(dim=1).sum(dim=1)
    padded = torch.full((n * width + n,), -1, dtype=torch.int64, device=accepted.device)
    padded[layout.draft_slots + layout.draft_slots // max(width, 1)] = drafts  # into [N, K + 1]
    padded = padded.view(n, width + 1)
    last = tokens[layout.first_rows + num_accepted]
    position = torch.arange(width + 1, device=accepted.device).unsqueeze(0)
    accepted_num = num_accepted.unsqueeze(1)
    token_ids = torch.where(position < accepted_num, padded,
                            torch.where(position == accepted_num, last.unsqueeze(1), -1))
    return VerifyOutput(token_ids=token_ids, num_accepted=num_accepted)


def _expand(metadata: SamplingMetadata, request_of_row: torch.Tensor) -> SamplingMetadata:
    """The request rows' sampling parameters repeated over their logits rows (generators: handled apart)."""
    def take(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[request_of_row]

    return SamplingMetadata(
        temperature=take(metadata.temperature), all_greedy=False, all_random=metadata.all_random,
        greedy_mask=take(metadata.greedy_mask), top_k=take(metadata.top_k), max_top_k=metadata.max_top_k,
        top_p=take(metadata.top_p), min_p=take(metadata.min_p), generators={}, max_num_logprobs=None,
        penalties=None, min_tokens=None)


def _validate(logits: torch.Tensor, num_draft_tokens: list[int], draft_token_ids: torch.Tensor,
              metadata: SamplingMetadata, draft_probs: torch.Tensor | None) -> None:
    if metadata.penalties is not None or metadata.min_tokens is not None:
        raise ValueError("metadata: penalties and min_tokens are not supported with speculative decoding "
                         "(the engine does not draft for such requests)")
    if metadata.seeds is not None:
        raise ValueError("metadata.seeds: the rejection sampler draws with generators (the torch path)")
    if any(not isinstance(k, int) or k < 0 for k in num_draft_tokens):
        raise ValueError(f"num_draft_tokens must be integers >= 0, got {num_draft_tokens}")
    num_rows, num_drafts = sum(num_draft_tokens) + len(num_draft_tokens), sum(num_draft_tokens)
    if logits.dim() != 2 or logits.shape[0] != num_rows:
        raise ValueError(f"logits must be [sum(k_i + 1) = {num_rows}, V], got {list(logits.shape)}")
    if metadata.temperature is not None and metadata.temperature.shape[0] != len(num_draft_tokens):
        raise ValueError(f"metadata must have one row per request ({len(num_draft_tokens)}), "
                         f"got {metadata.temperature.shape[0]}")
    if draft_token_ids.shape != (num_drafts,):
        raise ValueError(f"draft_token_ids must be [sum(k_i) = {num_drafts}], got {list(draft_token_ids.shape)}")
    if draft_probs is not None and draft_probs.shape != (num_drafts, logits.shape[1]):
        raise ValueError(f"draft_probs must be [{num_drafts}, {logits.shape[1]}], got {list(draft_probs.shape)}")
