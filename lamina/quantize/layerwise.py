"""Layer-by-layer calibration forward: the inputs of each decoder layer's linears, produced by the layers
before it as they are after quantization (GPTQ's sequential scheme; AWQ uses it too).

    sequences --embed--> state_0 --layer 0--> state_1 --layer 1--> ... --layer N-1--> state_N --norm--> lm_head
                         capture(layer L): forward layer L on state_L with hooks on some of its linears
                         advance(layer L): state_{L+1} = layer L(state_L), with whatever weights it has now

The state is lamina's own (hidden, residual) pair of the decoder (the residual add is fused into the norms),
kept per chunk of whole sequences (at most `max_batch_tokens` tokens a chunk). Attention runs through the
model's own attention layers on a KV cache large enough for one chunk, bound to every layer: a layer writes
its chunk's K/V and reads them back in the same call, so the layers can share it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lamina.attention.metadata import AttentionMetadata, prefill_metadata, set_attention_metadata
from lamina.kv.cache import allocate_kv_caches, bind_kv_caches
from lamina.models.common import CausalLM

BLOCK_SIZE = 16
MAX_BATCH_TOKENS = 8192


class InputStats:
    """What a calibration method keeps of one linear layer's inputs x [tokens, in_features]: the mean and max |x|
    of each input channel (SmoothQuant's max), optionally sum x xᵀ (GPTQ's Hessian) and about `max_samples`
    tokens drawn at random (AWQ's searches). Random, not every k-th token: a stride that divides the sequence
    length keeps the same positions of every sequence, and position 0 (an attention sink, with outsized
    activations) then took a quarter of AWQ's clipping tokens at 128 sequences and made the demo model worse
    the more data it saw."""

    def __init__(self, in_features: int, hessian: bool = False, max_samples: int = 0, total_tokens: int = 0,
                 seed: int = 0) -> None:
        self.count = 0
        self.abs_sum = torch.zeros(in_features, dtype=torch.float64)
        self.abs_max = torch.zeros(in_features)
        self.xtx = torch.zeros(in_features, in_features, dtype=torch.float64) if hessian else None
        self.rate = min(1.0, max_samples / total_tokens) if max_samples and total_tokens else 0.0
        self._generator = torch.Generator().manual_seed(seed)
        self._samples: list[torch.Tensor] = []

    def add(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).float()
        self.abs_sum += x.abs().sum(0).double()
        self.abs_max = torch.maximum(self.abs_max, x.abs().amax(0))
        if self.xtx is not None:
            self.xtx += (x.t() @ x).double()
        if self.rate:
            keep = torch.rand(x.shape[0], generator=self._generator) < self.rate
            self._samples.append(x[keep].clone())
        self.count += x.shape[0]

    def hessian(self) -> torch.Tensor:
        """H = 2 X Xᵀ / tokens, float32 [in, in] (GPTQ's normalisation: a mean over calibration tokens)."""
        assert self.xtx is not None and self.count
        return (2.0 * self.xtx / self.count).float()

    def mean_abs(self) -> torch.Tensor:
        return (self.abs_sum / max(self.count, 1)).float()

    def samples(self) -> torch.Tensor:
        """The kept tokens' inputs, [n, in] float32."""
        return torch.cat(self._samples)


@dataclass
class _Chunk:
    positions: torch.Tensor  # [T]
    metadata: AttentionMetadata
    hidden: torch.Tensor  # [T, hidden]: the state entering the next layer
    residual: torch.Tensor | None  # None before layer 0


class _Stop(Exception):
    """Raised by a capture hook once every hooked linear has seen its input: the rest of the layer is skipped."""


def _chunks(sequences: list[list[int]], max_tokens: int) -> list[list[list[int]]]:
    chunks: list[list[list[int]]] = [[]]
    for seq in sequences:
        if chunks[-1] and sum(map(len, chunks[-1])) + len(seq) > max_tokens:
            chunks.append([])
        chunks[-1].append(seq)
    return chunks


class LayerwiseRunner:
    """Calibration sequences through a float32 CPU model, one decoder layer at a time (module docstring)."""

    def __init__(self, model: CausalLM, sequences: list[list[int]], max_batch_tokens: int = MAX_BATCH_TOKENS) -> None:
        if not sequences:
            raise ValueError("calibration: no sequence to run")
        self.model = model
        self.total_tokens = sum(map(len, sequences))
        self.chunks: list[_Chunk] = []
        most_blocks = 1
        for chunk in _chunks(sequences, max_batch_tokens):
            ids = torch.tensor([t for seq in chunk for t in seq])
            positions = torch.cat([torch.arange(len(seq)) for seq in chunk])
            with torch.no_grad():
                hidden = model.model.embed_tokens(ids).float()
            self.chunks.append(_Chunk(positions, prefill_metadata([len(s) for s in chunk], BLOCK_SIZE), hidden, None))
            most_blocks = max(most_blocks, sum(-(-len(s) // BLOCK_SIZE) for s in chunk))
        cache = allocate_kv_caches(model.arch, most_blocks + 1, BLOCK_SIZE, torch.float32, "cpu")[0]
        bind_kv_caches(model, [cache] * model.arch.num_hidden_layers)

    @torch.no_grad()
    def capture(self, layer: nn.Module, stats: dict[str, InputStats], stop_early: bool = True) -> None:
        """Run `layer` on every chunk, adding each named linear's input to its `stats`; with `stop_early`,
        the forward stops once all of them have seen their input (the layer's state does not change)."""
        seen: set[str] = set()

        def hook(name: str):
            def record(module: nn.Module, args: tuple) -> None:
                stats[name].add(args[0])
                seen.add(name)
                if stop_early and len(seen) == len(stats):
                    raise _Stop
            return record

        handles = [layer.get_submodule(name).register_forward_pre_hook(hook(name)) for name in stats]
        try:
            for chunk in self.chunks:
                seen.clear()
                try:
                    with set_attention_metadata(chunk.metadata):
                        layer(chunk.positions, chunk.hidden, chunk.residual)
                except _Stop:
                    pass
        finally:
            for handle in handles:
                handle.remove()

    @torch.no_grad()
    def advance(self, layer: nn.Module) -> None:
        """Replace the state by `layer`'s output on it."""
        for chunk in self.chunks:
            with set_attention_metadata(chunk.metadata):
                chunk.hidden, chunk.residual = layer(chunk.positions, chunk.hidden, chunk.residual)

    @torch.no_grad()
    def final_hidden(self) -> list[torch.Tensor]:
        """The LM head's inputs (the final norm of the state after the last layer), one tensor per chunk."""
        return [self.model.model.norm(c.hidden, c.residual)[0] for c in self.chunks]
