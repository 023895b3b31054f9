"""GPTQ and AWQ on a whole (tiny) model: the checkpoints load in lamina and in transformers with the same
weights and logits, and the quantized model is closer to the float one than RTN's on the calibration data."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from lamina.quantize.methods import CALIBRATED, checkpoint_dtype, quantize_calibrated
from tests.quant.helpers import GROUP, dequantized_weights, hf_logits, lamina_logits, quantized, tiny_model

SEQUENCES = [[(7 * i + 31 * j + i * j) % 300 for i in range(96)] for j in range(8)]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("calibrated") / "fp32")


def _calibrated(source, out, method: str, act_order: bool = False, ignore: tuple[str, ...] = ("lm_head",)):
    return quantize_calibrated(str(source), str(out), CALIBRATED[method], GROUP, ignore, SEQUENCES, act_order,
                               progress=False)


@pytest.mark.parametrize("method,act_order,ignore,layers", [
    ("gptq", False, ("lm_head",), 14),
    ("gptq", True, (), 15),  # act-order; the LM head calibrated on the final norm's output
    ("awq", False, ("lm_head",), 14),
    ("awq", False, ("re:.*down_proj",), 13),  # the LM head clipped; no scale for an unquantized down_proj
])
def test_checkpoints_load_in_lamina_and_transformers(source, tmp_path, method, act_order, ignore, layers):
    from transformers import AutoModelForCausalLM

    out = tmp_path / method
    done, notes = _calibrated(source, out, method, act_order, ignore)
    assert len(done.quantized) == layers and (len(notes) == 2) == (method == "awq")
    weights = json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]["group_0"]
    assert weights["weights"]["actorder"] == ("static" if act_order else None)
    ours = dequantized_weights(out)
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    hf(torch.tensor([[1, 2]]))  # compressed-tensors decompresses on the first forward
    for name, weight in ours.items():
        assert torch.equal(hf.get_submodule(name).weight.float(), weight), name
    hf_out, lamina_out = hf_logits(out), lamina_logits(out)
    for key in hf_out:
        torch.testing.assert_close(lamina_out[key], hf_out[key], rtol=1e-4, atol=1e-4)


def test_awq_writes_its_folded_norms(source, tmp_path):
    _calibrated(source, tmp_path / "awq", "awq")
    before, after = load_file(str(source / "model.safetensors")), load_file(str(tmp_path / "awq" / "model.safetensors"))
    norms = [name for name in before if name.endswith("layernorm.weight")]
    assert len(norms) == 4 and all(not torch.equal(before[n], after[n]) for n in norms)
    assert torch.equal(before["model.embed_tokens.weight"], after["model.embed_tokens.weight"])


def _logit_error(model_dir, reference: dict[str, torch.Tensor], prompts: dict[str, list[int]]) -> float:
    logits = lamina_logits(model_dir, prompts)
    return sum(float((logits[k] - reference[k]).pow(2).mean()) for k in prompts)


def test_calibrated_models_are_closer_to_the_float_model_than_rtn(source, tmp_path):
    prompts = {str(i): seq[:28] for i, seq in enumerate(SEQUENCES[:4])}  # within the helper's 32 KV blocks
    reference = lamina_logits(source, prompts)
    rtn = _logit_error(quantized(source, tmp_path / "rtn4", "rtn4"), reference, prompts)
    for method in CALIBRATED:
        _calibrated(source, tmp_path / method, method)
        assert _logit_error(tmp_path / method, reference, prompts) < rtn, method


def test_scales_are_stored_in_the_checkpoint_dtype(tmp_path):
    source = tiny_model(tmp_path / "bf16", dtype=torch.bfloat16)
    assert checkpoint_dtype(str(source)) == torch.bfloat16
    _calibrated(source, tmp_path / "gptq", "gptq")
    tensors = load_file(str(tmp_path / "gptq" / "model.safetensors"))
    assert tensors["model.layers.0.mlp.down_proj.weight_scale"].dtype == torch.bfloat16
