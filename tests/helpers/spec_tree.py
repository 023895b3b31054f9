"""Speculative decoding in tests: a draft model close to a target, and how often an accepted path of tree drafts left
the main chain (its KV had to move)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lamina.spec.draft_tree import DraftTree


def perturbed_copy(model_dir: str, out: Path) -> Path:
    """The target with noise on every weight: a draft model close to it, not equal (about 60 % of its drafts
    are accepted)."""
    shutil.copytree(model_dir, out, dirs_exist_ok=True)
    weights = out / "model.safetensors"
    generator = torch.Generator().manual_seed(0)
    tensors = {name: t + 0.15 * t.std() * torch.randn(t.shape, generator=generator) if t.numel() > 1 else t
               for name, t in load_file(weights).items()}
    save_file(tensors, weights)
    return out


def count_off_chain(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """From now on, one entry per verified tree (DraftTree.moves): whether its accepted path left the main chain."""
    seen: list[bool] = []
    moves = DraftTree.moves

    def counting(self: DraftTree, path: list[int]) -> list[tuple[int, int]]:
        out = moves(self, path)
        seen.append(bool(out))
        return out
    monkeypatch.setattr(DraftTree, "moves", counting)
    return seen
