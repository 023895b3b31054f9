"""AWQ: the scaled-and-quantized layer reproduces the float layer better than RTN, the clipping search never
does worse than RTN on its tokens, and the folded scales leave the float model's logits unchanged."""
from __future__ import annotations

import pytest
import torch

from lamina.quant.config import WeightQuantArgs
from lamina.quant.rtn import rtn_quantize
from lamina.quantize import awq_layer
from lamina.quantize.awq import fake_quantize, search_clip, search_scale
from lamina.quantize.calibrate import LINEARS, CalibrationOptions, load_float_model
from lamina.quantize.layerwise import InputStats, LayerwiseRunner
from tests.helpers.paged import PagedRunner
from tests.quant.helpers import PROMPTS, tiny_model

ARGS = WeightQuantArgs(num_bits=4, symmetric=False, strategy="group", group_size=64)


def activations(tokens: int, features: int, seed: int = 0) -> torch.Tensor:
    """Inputs whose channels differ in scale by two orders of magnitude, a few of them salient."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.exp(torch.randn(features, generator=g))
    scales[:6] *= 15.0
    return torch.randn(tokens, features, generator=g) * scales


def output_error(x: torch.Tensor, weight: torch.Tensor, quantized: torch.Tensor) -> float:
    return float((x @ (weight - quantized).t()).pow(2).mean())


def test_scaled_and_quantized_layer_beats_rtn():
    x = activations(1024, 256)
    weight = 0.05 * torch.randn(128, 256, generator=torch.Generator().manual_seed(1))
    s, alpha = search_scale(x, x.abs().mean(0), weight, ARGS, torch.float32)
    awq = fake_quantize(weight * s, ARGS, torch.float32) / s
    rtn = rtn_quantize(weight, ARGS, torch.float32).dequantize()
    assert alpha > 0 and output_error(x, weight, awq) < 0.8 * output_error(x, weight, rtn)


def test_shared_scales_follow_the_expansion():
    x = activations(256, 128)
    expand = torch.arange(128) % 64  # two input columns per scale, as o_proj columns share a v channel
    mean_abs = x.abs().mean(0).view(2, 64).mean(0)
    s, _ = search_scale(x, mean_abs, torch.randn(32, 128), ARGS, torch.float32, expand)
    assert s.shape == (64,) and torch.isfinite(s).all()


def test_clipping_is_never_worse_than_rtn_on_its_tokens():
    x = activations(256, 256, seed=2)
    weight = 0.05 * torch.randn(64, 256, generator=torch.Generator().manual_seed(3))
    weight[:, ::17] *= 6.0  # a few large weights that stretch their groups' ranges
    clipped = rtn_quantize(search_clip(x, weight, ARGS, torch.float32), ARGS, torch.float32).dequantize()
    rtn = rtn_quantize(weight, ARGS, torch.float32).dequantize()
    assert output_error(x, weight, clipped) < output_error(x, weight, rtn)


def _logits(model, arch):
    return PagedRunner(model, arch, num_blocks=32).step(PROMPTS)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])  # GQA; q/k/v biases; q/k norms
def test_folded_scales_leave_the_float_logits_unchanged(tmp_path, kind, monkeypatch):
    model = load_float_model(str(tiny_model(tmp_path / "m", kind)))
    before = _logits(model, model.arch)
    g = torch.Generator().manual_seed(5)
    # Powers of two from 1/4 to 8: a correct fold then changes no rounding at all, so anything off shows.
    monkeypatch.setattr(awq_layer, "search_scale", lambda x, mean_abs, *a, **k: (
        2.0 ** torch.randint(-2, 4, mean_abs.shape, generator=g).float(), 0.5))
    runner = LayerwiseRunner(model, [list(range(3, 40)), list(range(50, 70))])
    targets = {f"model.layers.{i}.{linear}": ARGS for i in range(len(model.model.layers)) for linear in LINEARS}
    for index, layer in enumerate(model.model.layers):
        stats = {linear: InputStats(layer.get_submodule(linear).input_size, max_samples=64, total_tokens=57)
                 for linear in LINEARS}
        runner.capture(layer, stats, stop_early=False)
        folder = awq_layer._Folder(layer, f"model.layers.{index}", targets, CalibrationOptions(torch.float32), stats)
        with torch.no_grad():
            _fold_all(folder, layer)
        assert len(folder.alphas) == 4 and "input_layernorm.weight" in folder.changed
        runner.advance(layer)
    after = _logits(model, model.arch)
    for key in before:
        torch.testing.assert_close(after[key], before[key], rtol=0, atol=1e-5)


def _fold_all(folder, layer) -> None:
    qkv, o_proj, gate_up, down = LINEARS
    folder.norm_to_linear("input_layernorm", qkv)
    folder.rows_to_linear(qkv, awq_layer._v_rows(layer.self_attn), o_proj, awq_layer._kv_expand(layer.self_attn))
    folder.norm_to_linear("post_attention_layernorm", gate_up)
    half = layer.mlp.gate_up_proj.output_sizes[0]
    folder.rows_to_linear(gate_up, slice(half, 2 * half), down)
