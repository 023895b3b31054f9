"""SmoothQuant: the scales are the paper's formula, folding them leaves the float model's logits unchanged,
and on a model whose activations have outlier channels it makes W8A8 much closer to the float model than
plain W8A8 (w8a8, round to nearest); its checkpoints load in lamina and transformers alike."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import lamina.quant.w8a8 as w8a8
from lamina.loader.hf_config import load_model_arch
from lamina.quantize.methods import CALIBRATED, quantize_calibrated
from lamina.quantize.smoothquant import MAPPINGS, smooth, smoothing_scales
from tests.helpers.paged import PagedRunner
from tests.quant.helpers import (PROMPTS, dequantized_weights, hf_logits, lamina_logits, load, quantized,
                                tiny_model)

SEQUENCES = [[(7 * i + 31 * j + i * j) % 300 for i in range(64)] for j in range(8)]
OUTLIERS, FACTOR = [3, 50, 77], 40.0


def test_scales_follow_the_formula():
    act_max, weight = torch.tensor([4.0, 1.0]), torch.tensor([[0.5, -2.0], [0.1, 1.0]])
    expected = torch.tensor([4.0 ** 0.5 / 0.5 ** 0.5, 1.0 / 2.0 ** 0.5])
    torch.testing.assert_close(smoothing_scales(act_max, weight, 0.5), expected)
    torch.testing.assert_close(smoothing_scales(act_max, weight, 1.0), act_max)
    with pytest.raises(ValueError, match=r"--alpha must be within \[0, 1\]"):
        smoothing_scales(act_max, weight, 1.5)


def test_folding_keeps_the_float_logits(tmp_path):
    source = tiny_model(tmp_path / "fp32")  # grouped-query attention: 4 heads, 2 KV heads
    arch, model = load_model_arch(str(source)), load(source)
    before = PagedRunner(model, arch, num_blocks=32).step(PROMPTS)
    generator = torch.Generator().manual_seed(0)
    for layer in model.model.layers:
        for norm, linear in MAPPINGS:
            act_max = torch.rand(arch.hidden_size, generator=generator) * 20 + 0.1
            smooth(layer.get_submodule(norm), layer.get_submodule(linear), act_max, 0.5, torch.bfloat16)
    assert not torch.equal(model.model.layers[0].input_layernorm.weight.bfloat16().float(),
                           load(source).model.layers[0].input_layernorm.weight)
    after = PagedRunner(model, arch, num_blocks=32).step(PROMPTS)
    for key in before:
        torch.testing.assert_close(after[key], before[key], rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def outlier_model(tmp_path_factory):
    """A tiny model with a few huge activation channels before q/k/v and gate/up, the function unchanged:
    the norms' weights are multiplied by FACTOR on those channels, the linears' columns divided by it."""
    path = tiny_model(tmp_path_factory.mktemp("smoothquant") / "fp32")
    tensors = load_file(str(path / "model.safetensors"))
    for name in list(tensors):
        if name.endswith("layernorm.weight"):
            tensors[name][OUTLIERS] *= FACTOR
        elif any(p in name for p in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")):
            tensors[name][:, OUTLIERS] /= FACTOR
    save_file(tensors, str(path / "model.safetensors"))
    return path


def _error(model_dir, reference: dict[str, torch.Tensor]) -> float:
    logits = lamina_logits(model_dir)
    return sum(float((logits[k] - reference[k]).pow(2).mean()) for k in reference)


def test_smoothquant_beats_plain_w8a8_on_activation_outliers(outlier_model, tmp_path, monkeypatch):
    out = tmp_path / "sq"
    done, notes = quantize_calibrated(str(outlier_model), str(out), CALIBRATED["smoothquant"], 0, ("lm_head",),
                                      SEQUENCES, progress=False)
    assert len(done.quantized) == 14 and "smoothed: input_layernorm, post_attention_layernorm" in notes[
        "model.layers.0"]
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["format"] == "int-quantized" and config["config_groups"]["group_0"]["input_activations"]
    before, after = load_file(str(outlier_model / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert all(not torch.equal(before[n], after[n]) for n in before if n.endswith("layernorm.weight"))
    reference = lamina_logits(outlier_model)
    plain = quantized(outlier_model, tmp_path / "w8a8", "w8a8", group_size=0)
    ours, theirs = _error(out, reference), _error(plain, reference)
    assert ours < 0.2 * theirs, (ours, theirs)
    _same_in_transformers(out, monkeypatch)


def _same_in_transformers(out, monkeypatch) -> None:
    """Weights and folded norms exactly; logits exactly but where an activation lands on a rounding tie:
    x / scale computed a ulp apart rounds to the next int8 level in one model and not the other, and the
    difference then flows through every later position of that prompt (one of the three prompts moved by up
    to 0.17, mean 0.013, on torch 2.13; the other two within 1e-5). With the wrong activation range (127
    instead of compressed-tensors' 127.5) every prompt is off by a mean 0.06-0.09."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    hf(torch.tensor([[1, 2]]))  # compressed-tensors decompresses on the first forward
    for name, weight in dequantized_weights(out).items():
        assert torch.equal(hf.get_submodule(name).weight.float(), weight), name
    ours = load(out)
    assert torch.equal(hf.model.layers[1].input_layernorm.weight, ours.model.layers[1].input_layernorm.weight)
    monkeypatch.setattr(w8a8, "INT8_MAX", 127.5)  # transformers quantizes activations as compressed-tensors does
    hf_out, lamina_out = hf_logits(out), lamina_logits(out)
    gaps = sorted(float((lamina_out[key] - hf_out[key]).abs().max()) for key in hf_out)
    assert gaps[len(gaps) // 2] < 1e-4, gaps  # most prompts meet no tie at all
    for key in hf_out:
        assert float((lamina_out[key] - hf_out[key]).abs().mean()) < 0.02, key
        assert torch.equal(lamina_out[key].argmax(-1), hf_out[key].argmax(-1))


def test_alpha_is_smoothquant_only(outlier_model, tmp_path):
    with pytest.raises(ValueError, match="--alpha: gptq has no migration strength"):
        quantize_calibrated(str(outlier_model), str(tmp_path / "x"), CALIBRATED["gptq"], 64, ("lm_head",),
                            SEQUENCES, progress=False, alpha=0.3)
