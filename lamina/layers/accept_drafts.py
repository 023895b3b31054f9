"""Verification of one-hot drafts from samples: keep each request's drafts while they equal the target's own
samples, then one sample more. Host work on the step's samples, once they are read (a few ints a request).

    request i, k_i drafts, rows r_i .. r_i + k_i of `sampled` (row j sampled from the target's distribution
    after the prompt, the outputs and drafts 0 .. j-1):

      drafts     d_0   d_1   d_2                 a_i = leading j with sampled[r_i + j] == d_j   (here 2)
      sampled    s_0   s_1   s_2   s_3           tokens_i = s_0 .. s_{a_i}: the a_i accepted drafts (equal to
      equal?     yes   yes   no                  their samples) and s_{a_i}, the correction (a_i < k_i) or bonus
      tokens_i = [s_0, s_1, s_2]                 token (a_i = k_i)

Why this is rejection sampling exactly, for a proposal q that puts all its mass on d_j: Leviathan et al. keep d_j
with probability min(1, p(d_j) / q(d_j)) = p(d_j), the chance that a sample s_j ~ p equals d_j; on rejection they
sample from norm(max(0, p - q)) = p without d_j, which is the law of s_j given s_j != d_j. So each emitted token is
s_j ~ p exactly, and every row is an ordinary sample: greedy rows are an argmax, seeded rows are keyed by their own
position, and one sampler launch serves a whole verify step. (Proposals with a distribution of their own need
lamina.layers.rejection_sampler instead.)
"""
from __future__ import annotations

from collections.abc import Sequence


def accept_drafts(sampled: Sequence[int], num_drafts: Sequence[int], draft_ids: Sequence[int]) -> list[list[int]]:
    """Each request's tokens (module docstring): `sampled` holds every request's k_i + 1 samples in order,
    `draft_ids` its k_i drafts, flat in the same order."""
    tokens, row, flat = [], 0, 0
    for k in num_drafts:
        accepted = 0
        while accepted < k and sampled[row + accepted] == draft_ids[flat + accepted]:
            accepted += 1
        tokens.append(list(sampled[row:row + accepted + 1]))
        row, flat = row + k + 1, flat + k
    return tokens
