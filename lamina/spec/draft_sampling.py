"""Drafts drawn with the noise of the rows that verify them: sampled drafts that are exact whatever they are.

The verify step samples every row of a drafting request from the target and keeps the drafts while they equal
those samples (lamina/layers/accept_drafts.py). Its row j samples the token at index N + j (N = len(token_ids))
with noise keyed by the request's seed (the worker's BatchState: the user's seed, or a salt) and that index. Draft
j is drawn here with the same noise from the drafter's own distribution q_j:

    verify row j   s_j = race(p_j, E_j)        race(r, E) = argmax_t r_t / E_t, E_t ~ Exp(1): the sampler's
    draft j        d_j = race(q_j, E_j)        exponential race on the torch path, or the sampling kernel's
                                               Gumbel-max over the same Philox uniforms (lamina/kernels/sampling.py)

d_j is a sample of q_j, and the step emits s_0 .. s_a, the target's own samples: the drafts decide how many samples
one step keeps, never what they are (drafter-invariant speculative decoding: Daliri, Musco and Suresh, 2024), so a
seeded request's tokens stay those of a run without speculation. Draft j is accepted when the two races agree:
with probability sum_t 1 / sum_u max(p_u / p_t, q_u / q_t), at least (1 - d) / (1 + d) for a total variation d,
and in practice close to Leviathan et al.'s sum_t min(p_t, q_t); an argmax draft is accepted with p_j(argmax q_j).

    q_j   the drafter's logits / the request's temperature, then its top-p and min-p (not its top-k: a CUDA graph
          would fix the width of the top-k); requests without a key or at temperature 0 draft the argmax.

The proposers whose network is a language model sample so (a draft model; early exit, the target's own first
layers); EAGLE's and Medusa's heads, trained on the target's greedy tokens, draft the argmax (lamina/spec/eagle.py).

`DraftKeys` holds one propose call's rows on the host; `DraftPicker` draws eagerly; a DraftLoop draws inside its
CUDA graph from static copies of the same (lamina/spec/draft_loop.py). Both go through `pick`. Tree drafts take a
node's c children from `ranked`: `pick`'s draft (the chain's draft there), then q's most likely tokens without it.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch

from lamina.device import packed_to_device
from lamina.layers.dispatch import kernel_module
from lamina.layers.sampler import apply_min_p, apply_top_k_top_p, exponential_race, uses_sampling_kernel
from lamina.layers.sampling_metadata import seeded_keys
from lamina.spec.model_proposer import DraftRequest

__all__ = ["DraftKeys", "DraftPicker", "coupled_acceptance", "pick", "ranked", "sampling_kernels"]


@dataclass
class DraftKeys:
    """How each row of one propose call (in the proposer's order) draws its drafts."""

    params: np.ndarray  # [3, b] float32: temperature (0: the argmax), top-p (1: off), min-p (0: off)
    keys: np.ndarray  # [k, b] int64: the key of the verify row of draft j (seeded_keys of index N + j)

    @classmethod
    def of(cls, requests: Sequence[DraftRequest], k: int) -> DraftKeys | None:
        """The rows of `requests`, k drafts each at most; None when every row drafts the argmax."""
        sampled = [r.seed is not None and r.temperature > 0 for r in requests]
        if not any(sampled):
            return None
        params = DraftKeys.argmax_params(len(requests))
        params[:, sampled] = np.array([[r.temperature, r.top_p, r.min_p] for r, s in zip(requests, sampled) if s],
                                      dtype=np.float32).T
        seeds = [r.seed if s else 0 for r, s in zip(requests, sampled)]
        index = np.array([len(r.token_ids) for r in requests], dtype=np.int64)[None, :] + np.arange(k)[:, None]
        keys = seeded_keys(seeds * k, index.ravel()).reshape(k, len(requests))
        return cls(params, keys)

    @staticmethod
    def argmax_params(num_rows: int) -> np.ndarray:
        """[3, num_rows]: rows that draft the argmax."""
        return np.array([[0.0], [1.0], [0.0]], dtype=np.float32).repeat(num_rows, axis=1)


def sampling_kernels(device: torch.device) -> ModuleType | None:
    """The sampling kernel module where the target's sampler uses it (CUDA with triton), else None."""
    return kernel_module("sampling") if uses_sampling_kernel(device) else None


def pick(logits: torch.Tensor, params: Sequence[torch.Tensor], keys: torch.Tensor, kernels: ModuleType | None
         ) -> torch.Tensor:
    """Each row's draft [n] from `logits` [n, V]: `params` the rows' temperature, top-p and min-p ([n] float32
    each: DraftKeys.params), `keys` [n] (one draft index's keys), on logits' device. With `kernels` (CUDA): one
    launch of the sampling kernel, no host work (capturable); without: the torch path, which reads params and
    keys on the host."""
    temperature, top_p, min_p = params
    if kernels is not None:
        return kernels.sample(logits, temperature, keys, top_p=top_p, min_p=min_p)
    rows = [i for i, t in enumerate(temperature.tolist()) if t > 0]
    tokens = logits.argmax(dim=-1)
    if rows:
        index = torch.tensor(rows, device=logits.device)
        chosen = [p.index_select(0, index) for p in params]
        tokens[index] = _race(logits.index_select(0, index).float(), chosen, keys[index].tolist())
    return tokens


def ranked(logits: torch.Tensor, params: Sequence[torch.Tensor], keys: torch.Tensor, count: int,
           kernels: ModuleType | None) -> torch.Tensor:
    """Each row's `count` drafts [n, count] from `logits` [n, V], best first: `pick`'s draft (the argmax at
    temperature 0), then the argmax order without it. Capturable where `pick` is (with `kernels`)."""
    first = pick(logits, params, keys, kernels)
    if count == 1:
        return first[:, None]
    order = logits.topk(count, dim=-1).indices
    keep = torch.argsort((order == first[:, None]).to(torch.int8), dim=1, stable=True)[:, :count - 1]
    return torch.cat([first[:, None], order.gather(1, keep)], dim=1)


def _race(logits: torch.Tensor, params: list[torch.Tensor], keys: list[int]) -> torch.Tensor:
    """The sampler's torch path on q (lamina.layers.sampler.random_probs without top-k), each row's noise from a
    generator seeded as its verify row's (lamina/worker/model_runner.py's _seeded_generators)."""
    temperature, top_p, min_p = params
    x = logits / temperature.unsqueeze(1)
    if bool((top_p < 1).any()):
        x = apply_top_k_top_p(x, None, 0, top_p)
    probs = x.softmax(dim=-1)
    if bool((min_p > 0).any()):
        probs = apply_min_p(probs, min_p)
    generators = {row: torch.Generator(logits.device).manual_seed(key % 2**64) for row, key in enumerate(keys)}
    return exponential_race(probs, generators, None)


class DraftPicker:
    """`pick` for eager drafting: picker(logits, j) draws draft j of the call's first len(logits) rows."""

    def __init__(self, keys: DraftKeys | None, device: torch.device) -> None:
        self.kernels = sampling_kernels(device)
        self.params: list[torch.Tensor] = []
        self.keys: list[torch.Tensor] = []
        if keys is not None:  # each field aligned (packed_to_device): no kernel variant per batch size
            self.params = packed_to_device(list(keys.params), np.float32, device)
            self.keys = packed_to_device(list(keys.keys), np.int64, device)

    def __call__(self, logits: torch.Tensor, j: int) -> torch.Tensor:
        if not self.params:
            return logits.argmax(dim=-1)
        n = logits.shape[0]
        return pick(logits, [p[:n] for p in self.params], self.keys[j][:n], self.kernels)


def coupled_acceptance(p: torch.Tensor, q: torch.Tensor, top: int = 256, chunk: int = 64) -> torch.Tensor:
    """[n]: the chance that a draft drawn from q's row with the noise of p's row equals p's sample, sum_t 1 /
    sum_u max(p_u / p_t, q_u / q_t) (both races pick t when every E_u exceeds E_t times that ratio); p, q [n, V]
    probabilities. The sums run over the union of each row's top `top` tokens of p and of q (an analysis tool:
    scripts/spec_acceptance_ceiling.py)."""
    out = []
    for start in range(0, len(p), chunk):
        pc, qc = p[start:start + chunk], q[start:start + chunk]
        index = torch.cat([pc.topk(min(top, pc.shape[1]), -1).indices, qc.topk(min(top, qc.shape[1]), -1).indices],
                          -1)
        ordered, order = index.sort(-1)
        repeated = torch.zeros_like(index, dtype=torch.bool)
        repeated.scatter_(1, order[:, 1:], ordered[:, 1:] == ordered[:, :-1])  # a token's second entry
        ps, qs = pc.gather(1, index).masked_fill(repeated, 0), qc.gather(1, index).masked_fill(repeated, 0)
        ratio = torch.maximum(ps[:, None, :] / ps[:, :, None], qs[:, None, :] / qs[:, :, None]).nan_to_num(0.0)
        out.append((1 / ratio.sum(-1)).masked_fill(repeated, 0).sum(-1))
    return torch.cat(out)
