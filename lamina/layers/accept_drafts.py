"""Verification of one-hot drafts from samples: keep each request's drafts while they equal the target's own
samples, then one sample more.

    request i, k_i drafts, rows r_i .. r_i + k_i of `sampled` (row j sampled from the target's distribution
    after the prompt, the outputs and drafts 0 .. j-1):

      drafts     d_0   d_1   d_2                 a_i = leading j with sampled[r_i + j] == d_j   (here 2)
      sampled    s_0   s_1   s_2   s_3           tokens = s_0 .. s_{a_i}: the a_i accepted drafts (equal to their
      equal?     yes   yes   no                  samples) and s_{a_i}, the correction (a_i < k_i) or bonus token
      token_ids[i] = [s_0, s_1, s_2, -1, ..]     [N, K + 1], -1 pads (K = max k_i)

Why this is rejection sampling exactly, for a proposal q that puts all its mass on d_j: Leviathan et al. keep d_j
with probability min(1, p(d_j) / q(d_j)) = p(d_j), the chance that a sample s_j ~ p equals d_j; on rejection they
sample from norm(max(0, p - q)) = p without d_j, which is the law of s_j given s_j != d_j. So each emitted token is
s_j ~ p exactly, and every row is an ordinary sample: greedy rows are an argmax, seeded rows are keyed by their own
position, and one sampler launch serves a whole verify step. (Proposals with a distribution of their own need
lamina.layers.rejection_sampler instead.)
"""
from __future__ import annotations

import numpy as np
import torch

from lamina.layers.sampling_metadata import host_to_device

NO_DRAFT = -2  # pads the draft matrix: never equal to a sample


def accept_drafts(sampled: torch.Tensor, num_drafts: list[int], draft_ids: list[int]) -> torch.Tensor:
    """token_ids [N, K + 1] int64 on sampled's device (module docstring): `sampled` [sum(k_i + 1)] holds every
    request's k_i + 1 samples in order; `draft_ids` its k_i drafts, flat in the same order."""
    n, width = len(num_drafts), max(num_drafts) + 1
    rows = np.zeros((n, width), dtype=np.int64)  # index into `sampled` of (request, j); clamped past k_i
    drafts = np.full((n, width), NO_DRAFT, dtype=np.int64)
    start = flat = 0
    for i, k in enumerate(num_drafts):
        rows[i] = start + np.minimum(np.arange(width), k)
        drafts[i, :k] = draft_ids[flat:flat + k]
        start, flat = start + k + 1, flat + k
    index, proposed = host_to_device(torch.from_numpy(np.stack([rows, drafts])), torch.int64, sampled.device)
    samples = sampled[index]
    equal = (samples[:, :-1] == proposed[:, :-1]).to(torch.int64)
    num_accepted = equal.cumprod(dim=1).sum(dim=1, keepdim=True)
    position = torch.arange(width, device=sampled.device).unsqueeze(0)
    return torch.where(position <= num_accepted, samples, -1)
