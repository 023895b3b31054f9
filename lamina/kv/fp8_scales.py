"""Per-head scales of an fp8 KV cache, measured at start-up for the layers whose checkpoint has none (and by
`lamina quantize --kv-cache-scheme fp8` on text, lamina/quantize/kv_scales.py).

e4m3 holds |x| up to 448 with 3 mantissa bits down to 2^-6, then subnormals down to 2^-9: stored unscaled, the
K / V of a model whose values sit near 0.01 lose most of their bits (a tiny random Llama: 53 of 144 greedy tokens
kept with scale 1). So each KV head gets scale = HEADROOM * amax / 448, amax measured over CALIB_SEQUENCES
sequences of random token ids run through the model with a temporary cache in the model's dtype (the worker has
no tokenizer; a checkpoint calibrated on real text, `self_attn.k_scale` / `v_scale`, wins). HEADROOM leaves
room for values past the calibration's: e4m3's relative precision does not depend on the scale, only where its
subnormals begin.
"""
from __future__ import annotations

import logging

import torch
from torch import nn
from tqdm import tqdm

from lamina.attention.layer import Attention
from lamina.attention.torch_ref import FP8_MAX
from lamina.attention.metadata import prefill_metadata, set_attention_metadata
from lamina.config import ModelArch
from lamina.kv.cache import allocate_kv_caches, attention_layers, bind_kv_caches

logger = logging.getLogger(__name__)

CALIB_SEQUENCES = 4
CALIB_TOKENS = 256
HEADROOM = 2.0
_BLOCK = 16


def needs_calibration(model: nn.Module) -> list[Attention]:
    """The attention layers whose scales the checkpoint did not set."""
    return [layer for layer in attention_layers(model) if not layer.kv_scales_loaded]


def calibrate_kv_scales(model: nn.Module, arch: ModelArch, dtype: torch.dtype, device: torch.device,
                        seed: int = 0) -> int:
    """Measure and set the scales of the layers `needs_calibration` names, over CALIB_SEQUENCES sequences of
    random token ids; returns how many layers. Leaves the model's attention layers bound to a temporary cache:
    bind the real one after."""
    layers = needs_calibration(model)
    if not layers:
        return 0
    n = min(CALIB_TOKENS, arch.max_position_embeddings)
    generator = torch.Generator().manual_seed(seed)
    sequences = [torch.randint(0, arch.vocab_size, (n,), generator=generator).tolist()
                 for _ in range(CALIB_SEQUENCES)]
    measure_kv_scales(model, layers, arch, dtype, device, sequences)
    logger.info("fp8 KV cache: per-head scales of %d layer(s) measured at start-up (the checkpoint has none)",
                len(layers))
    return len(layers)


@torch.inference_mode()
def measure_kv_scales(model: nn.Module, layers: list[Attention], arch: ModelArch, dtype: torch.dtype,
                      device: torch.device, sequences: list[list[int]], progress: bool = False) -> None:
    """Set each of `layers`' k_scale / v_scale to HEADROOM * max |x| / FP8_MAX per KV head, the max over the K / V
    the model computes for `sequences` (each run alone, over a temporary cache in `dtype`, bound to the model's
    attention layers afterwards: bind the real one after). `lamina quantize --kv-cache-scheme` runs it on text,
    with a progress bar over the sequences when `progress`."""
    amax = {id(layer): torch.zeros(2, layer.num_kv_heads, device=device) for layer in layers}

    def observe(module: nn.Module, args: tuple, output: torch.Tensor) -> None:  # noqa: ARG001 - a forward hook
        for row, x in enumerate(args[1:3]):  # (q, k, v): k and v
            heads = x.reshape(x.shape[0], module.num_kv_heads, -1).abs().amax(dim=(0, 2)).float()
            torch.maximum(amax[id(module)][row], heads, out=amax[id(module)][row])

    hooks = [layer.register_forward_hook(observe) for layer in layers]
    try:
        _run(model, arch, dtype, device, sequences, progress)
    finally:
        for hook in hooks:
            hook.remove()
    for layer in layers:
        k, v = (HEADROOM * amax[id(layer)].clamp(min=1e-6) / FP8_MAX).unbind(0)
        layer.k_scale.copy_(k)
        layer.v_scale.copy_(v)


def _run(model: nn.Module, arch: ModelArch, dtype: torch.dtype, device: torch.device,
         sequences: list[list[int]], progress: bool) -> None:
    """One forward per sequence, each over the start of one temporary cache."""
    longest = max(map(len, sequences))
    num_blocks = -(-longest // _BLOCK)
    bind_kv_caches(model, allocate_kv_caches(arch, num_blocks + 1, _BLOCK, dtype, device))
    for ids in tqdm(sequences, desc="fp8 KV scales", unit="seq", disable=not progress):
        with set_attention_metadata(prefill_metadata([len(ids)], _BLOCK, device)):
            model(torch.tensor(ids, device=device), torch.arange(len(ids), device=device))
