"""Proposer: the one interface of every speculative-decoding method (n-gram, draft model, EAGLE, ...).

A proposer guesses how each request continues; the target model verifies the guesses in one forward and
the verify step keeps the accepted prefix (lamina/layers/accept_drafts.py). A proposer never
decides what the output is, so a bad guess costs time, never correctness.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from lamina.config import ModelArch, SpeculativeConfig
from lamina.spec.draft_tree import DraftTree
from lamina.spec.model_proposer import ModelProposer
from lamina.spec.ngram import NgramProposer

__all__ = ["Proposer", "draft_tree", "make_proposer", "make_model_proposer"]


@runtime_checkable
class Proposer(Protocol):
    """Draft tokens for a batch of requests.

    Contract of `propose(token_ids, max_drafts)`:

    - `token_ids[i]` is request i's prompt followed by its verified output tokens (never earlier drafts);
      a NumPy int array is accepted wherever a sequence is.
    - The answer has one list per request, in order: `drafts[i]` continues `token_ids[i]`, i.e. drafts[i][0]
      is the proposer's guess of the token right after token_ids[i][-1], drafts[i][1] the one after it, ...
    - `len(drafts[i]) <= max_drafts[i]` always, and may be anything from 0 to that bound (0: no guess;
      the request then decodes one token as without speculation). `max_drafts[i] == 0` gives [].
    - Draft ids are token ids of the target's vocabulary (the proposer shares the target's tokenizer).

    A proposer that copies drafts from an earlier match (n-gram) may also have `propose_with_matches(token_ids,
    max_drafts) -> (drafts, match lengths)`: the adaptive policy then judges each draft by its match's length
    (lamina/engine/match_acceptance.py); and `has_match(token_ids[i]) -> bool`, whether `propose` would find
    drafts for it, which the gate's FULL windows ask at every step launched ahead (lamina/engine/speculator.py).
    """

    def propose(self, token_ids: list[Sequence[int]], max_drafts: list[int]) -> list[list[int]]:
        ...


def draft_tree(config: SpeculativeConfig | None) -> DraftTree | None:
    """The tree of `config.speculative_token_tree` (None: chains)."""
    if config is None or config.speculative_token_tree is None:
        return None
    return DraftTree.of(config.speculative_token_tree)


def make_proposer(config: SpeculativeConfig) -> Proposer | None:
    """The engine-side proposer of `config.method`; None for the methods that run in the worker."""
    if config.method != "ngram":
        return None
    return NgramProposer(config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max)


def make_model_proposer(config: SpeculativeConfig, target: torch.nn.Module, arch: ModelArch, dtype: torch.dtype,
                        device: torch.device, block_size: int, attention_backend: str) -> ModelProposer | None:
    """The worker-side proposer of `config.method` (lamina/spec/model_proposer.py); None for n-gram. One file
    per method here, imported only when used."""
    if config.method == "draft_model":  # the heads below take the target's KernelChoice; the draft model too
        from lamina.spec.draft_model import DraftModelProposer
        return DraftModelProposer(config.model, arch, dtype, device, attention_backend, target.kernels,
                                  draft_tree(config))
    if config.method == "medusa":
        from lamina.spec.medusa import MedusaProposer
        return MedusaProposer(config.model, target, device, dtype, draft_tree(config))
    if config.method == "eagle":
        from lamina.spec.eagle import EagleProposer
        return EagleProposer(config.model, target, dtype, device, attention_backend, draft_tree(config))
    if config.method == "early_exit":
        from lamina.spec.early_exit import EarlyExitProposer
        return EarlyExitProposer(target, config.exit_layer, block_size)
    return None
