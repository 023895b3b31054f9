"""Medusa: K residual heads on the target's last hidden state draft K tokens at once (no KV, no extra forward).

    hidden h = the target's final hidden state at N - 2 (after its last norm; the LM head's input there
               sampled the newest token, at N - 1)
    head j:    f_j = h + SiLU(W_j h + b_j)          (Medusa-1's ResBlock; more layers: applied in turn)
               draft_j = argmax(lm_head(f_j))       the token at position N + j, j = 0 .. K - 1

The LM head is the target's own (reused, not copied), so a head set is K x (hidden^2 + hidden) parameters.
W_j starts at zero: a fresh head repeats the base head's guess for N - 1 (a useless but valid draft).

Medusa's tree (`tree`, lamina/spec/draft_tree.py): node (r_1, .., r_d) is the rank-r_d token of head d - 1,
whatever its parent's token (the heads read the same h); the verify step then finds the path the target takes.

A head directory (`speculative_config.model`, written by `lamina distill --method medusa`) holds
config.json {"medusa_num_heads", "medusa_num_layers", "hidden_size", "vocab_size", "base_model", ...} and
model.safetensors with the tensors `medusa_head.{j}.{l}.linear.weight` [hidden, hidden] and `.bias` [hidden]
(the names of the original Medusa repository, whose per-head LM copies `medusa_head.{j}.{L}.weight` lamina
does not use).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from lamina.config import KernelChoice
from lamina.layers.dispatch import DEFAULT_KERNELS
from lamina.layers.linear import DenseLinear
from lamina.models.common import CausalLM
from lamina.models.names import format_names
from lamina.spec.draft_tree import DraftTree
from lamina.spec.model_proposer import DraftRequest, Drafts

__all__ = ["MedusaHeads", "MedusaProposer", "load_medusa_config", "CONFIG", "WEIGHTS"]

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
FIELD = "speculative_config.model"


class ResBlock(nn.Module):
    """x + SiLU(linear(x)), the linear zero-initialised (the block starts as the identity)."""

    def __init__(self, hidden_size: int, kernels: KernelChoice = DEFAULT_KERNELS) -> None:
        super().__init__()
        self.linear = DenseLinear(hidden_size, hidden_size, kernels=kernels)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """K heads of `num_layers` ResBlocks each; `forward` gives the LM head's inputs, one per head. `kernels`: the
    target's KernelChoice."""

    def __init__(self, num_heads: int, hidden_size: int, num_layers: int = 1,
                 kernels: KernelChoice = DEFAULT_KERNELS) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.medusa_head = nn.ModuleList(
            nn.Sequential(*(ResBlock(hidden_size, kernels) for _ in range(num_layers))) for _ in range(num_heads))

    def forward(self, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """hidden [..., hidden_size] -> [num_heads, ..., hidden_size] (the first `num_heads` heads; all by default)."""
        heads = self.medusa_head[: self.num_heads if num_heads is None else num_heads]
        return torch.stack([head(hidden) for head in heads])

    def config_dict(self, base_model: str, vocab_size: int, **extra: Any) -> dict[str, Any]:
        """The config.json of a head directory for these heads."""
        return {"medusa_num_heads": self.num_heads, "medusa_num_layers": self.num_layers,
                "hidden_size": self.hidden_size, "vocab_size": vocab_size, "base_model": base_model, **extra}


def _positive_int(config: dict[str, Any], key: str, where: Path) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{FIELD}: {where / CONFIG} needs {key!r}, an integer >= 1, got {value!r}")
    return value


def load_medusa_config(model_dir: str | Path) -> dict[str, Any]:
    """Read and check a head directory's config.json (fields in the module docstring)."""
    root = Path(model_dir)
    if not (root / CONFIG).is_file() or not (root / WEIGHTS).is_file():
        raise ValueError(f"{FIELD}: {str(model_dir)!r} is not a Medusa head directory "
                         f"(needs {CONFIG} and {WEIGHTS}, as written by `lamina distill --method medusa`)")
    try:
        config = json.loads((root / CONFIG).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{FIELD}: {root / CONFIG} is not valid JSON ({err.msg})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{FIELD}: {root / CONFIG} must hold a JSON object")
    config.setdefault("medusa_num_layers", 1)
    for key in ("medusa_num_heads", "medusa_num_layers", "hidden_size", "vocab_size"):
        _positive_int(config, key, root)
    return config


def load_heads(model_dir: str | Path, config: dict[str, Any] | None = None, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32, kernels: KernelChoice = DEFAULT_KERNELS) -> MedusaHeads:
    """Build the heads of a head directory and load their weights strictly (every tensor, nothing else)."""
    config = load_medusa_config(model_dir) if config is None else config
    heads = MedusaHeads(config["medusa_num_heads"], config["hidden_size"], config["medusa_num_layers"], kernels)
    tensors = load_file(str(Path(model_dir, WEIGHTS)))
    expected = heads.state_dict()
    unexpected, missing = sorted(set(tensors) - set(expected)), sorted(set(expected) - set(tensors))
    if unexpected or missing:
        raise ValueError(f"{FIELD}: {Path(model_dir, WEIGHTS)} does not match its config: "
                         f"unexpected {format_names(unexpected)}, missing {format_names(missing)}")
    for name, tensor in tensors.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(f"{FIELD}: tensor {name!r} has shape {tuple(tensor.shape)}, expected "
                             f"{tuple(expected[name].shape)} (hidden_size {config['hidden_size']})")
    heads.load_state_dict(tensors)
    return heads.to(device=device, dtype=dtype).eval().requires_grad_(False)


class MedusaProposer:
    """The ModelProposer of `speculative_config.method == "medusa"` (lamina/spec/model_proposer.py).

    Drafts are greedy (argmax), so they are one-hot proposals, exact under rejection sampling at any
    temperature; not sampled (lamina/spec/draft_sampling.py): the heads learn the target's greedy tokens, as
    EAGLE's head does (lamina/spec/eagle.py says what sampling cost there). A request gets min(num_drafts, K)
    drafts, or with a `tree` its first min(num_drafts, nodes) nodes (the module docstring). One `propose` call runs
    every needed head over every row: one matmul per head (per layer), one `compute_logits` over the stacked rows,
    one argmax (a tree: one top-k and a gather); the drafts stay on the device.
    """

    uses_hidden = True  # its heads read the target's last hidden state

    def __init__(self, model_dir: str, target: CausalLM, device: torch.device | str, dtype: torch.dtype,
                 tree: DraftTree | None = None) -> None:
        self.config = load_medusa_config(model_dir)
        arch = target.arch
        for key, theirs in (("hidden_size", arch.hidden_size), ("vocab_size", arch.vocab_size)):
            if self.config[key] != theirs:
                raise ValueError(f"{FIELD}: the Medusa heads in {model_dir!r} have {key} {self.config[key]}, "
                                 f"the target model has {theirs}; heads only fit the model they were trained on")
        self.heads = load_heads(model_dir, self.config, device, dtype, target.kernels)
        self.target = target
        self.num_heads = self.heads.num_heads
        if tree is not None and tree.depth > self.num_heads:
            raise ValueError(f"speculative_token_tree: {tree.depth} deep, and the Medusa heads in {model_dir!r} draft "
                             f"{self.num_heads} tokens ahead (one level a head)")
        self.tree = tree

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest], hidden: torch.Tensor) -> Drafts:
        """Up to min(num_drafts, K) greedy drafts per request (a tree: its first nodes); `hidden` [len(requests),
        hidden_size]."""
        size = self.num_heads if self.tree is None else self.tree.size
        limits = [max(0, min(r.num_drafts, size)) for r in requests]
        most = max(limits, default=0)
        if most == 0:
            return Drafts.empty(len(requests), hidden.device)
        num_heads = most if self.tree is None else max(self.tree.depths[:most])
        features = self.heads(hidden, num_heads)  # [num_heads, rows, hidden]
        logits = self.target.compute_logits(features.reshape(-1, features.shape[-1]))
        logits = logits.view(num_heads, len(requests), -1)
        if self.tree is None:
            return Drafts.per_request(logits.argmax(dim=-1).t(), limits)
        ranks = [path[-1] for path in self.tree.paths[:most]]
        top = logits.topk(max(ranks) + 1, dim=-1).indices  # [num_heads, rows, ranks]
        depth, rank = (torch.tensor(v, device=top.device) for v in (self.tree.depths[:most], ranks))
        return Drafts.per_request(top[depth - 1, :, rank].t(), limits)  # node i: head depth - 1's rank-r token

    def forget(self, req_ids: Iterable[str]) -> None:
        """Medusa keeps nothing per request."""

    def kv_bytes_per_block(self, block_size: int) -> int:
        """Medusa keeps no KV."""
        return 0

    def bind_cache(self, num_blocks: int, block_size: int) -> None:
        """Medusa keeps no KV: nothing to allocate."""

    def compile_and_capture(self, max_batch_size: int, max_model_len: int, num_drafts: int,
                            warm_up: Callable[[torch.nn.Module], None] | None) -> None:
        """Nothing: the heads are plain matmuls, the LM head is the target's (compiled with it), and a propose
        call is a handful of kernels, run eagerly."""
