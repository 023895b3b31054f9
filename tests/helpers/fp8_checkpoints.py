"""FP8 checkpoints written by compressed-tensors itself, as llm-compressor's FP8 scheme writes them: one weight
scale per tensor (max |w| / 448), and one static input scale per layer or dynamic per-token inputs."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch


def fp8_per_tensor_checkpoint(source: Path, out: Path, input_scale: Callable[[str], float] | None) -> None:
    """`source` (an HF checkpoint) with every Linear but the LM head in fp8; input_scale(module name) gives each
    layer's static input scale, None makes the inputs dynamic (per token)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig, QuantizationScheme,
                                                 apply_quantization_config)
    from transformers import AutoModelForCausalLM

    static = input_scale is not None
    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
    fp8 = dict(num_bits=8, type="float", symmetric=True)
    weights = QuantizationArgs(**fp8, strategy="tensor", dynamic=False)
    inputs = QuantizationArgs(**fp8, strategy="tensor" if static else "token", dynamic=not static)
    scheme = QuantizationScheme(targets=["Linear"], weights=weights, input_activations=inputs)
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"]))
    with torch.no_grad():
        for name, module in model.named_modules():
            if hasattr(module, "weight_scale"):
                module.weight_scale.fill_(module.weight.abs().max() / 448)
                if static:
                    module.input_scale.fill_(input_scale(name))
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(str(out))
    compressor.update_config(str(out))
