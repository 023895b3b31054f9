"""lamina's compressed-tensors checkpoints against the real library (compressed-tensors, through transformers):

- a checkpoint lamina writes loads in transformers (which decompresses it with compressed-tensors' own code)
  to exactly lamina's dequantized weights, and both give the same logits;
- a checkpoint that compressed-tensors' ModelCompressor writes from the same integers and scales loads in
  lamina to exactly the same weights and logits as lamina's own checkpoint.
"""
from __future__ import annotations

import pytest
import torch

from lamina.quant.compressed_tensors import weights_dict
from lamina.quant.recipe import get_recipe
from lamina.quant.rtn import rtn_quantize
from tests.quant.helpers import GROUP, dequantized_weights, hf_logits, lamina_logits, quantized, tiny_model

pytest.importorskip("compressed_tensors")

CASES = [("int8", "pack-quantized"), ("rtn4", "pack-quantized"), ("int8", "naive-quantized")]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("ct") / "fp32")


@pytest.mark.parametrize("method", ["int8", "rtn4"])
def test_transformers_decompresses_lamina_checkpoints_to_lamina_weights(source, tmp_path, method):
    from transformers import AutoModelForCausalLM

    out = quantized(source, tmp_path / method, method)
    ours = dequantized_weights(out)
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    hf(torch.tensor([[1, 2]]))  # compressed-tensors decompresses on the first forward
    theirs = {name: m.weight for name, m in hf.named_modules() if name in ours}
    assert set(theirs) == set(ours) and len(ours) == 2 * 7  # every projection of both layers, not lm_head
    for name, weight in ours.items():
        assert torch.equal(theirs[name].float(), weight), name
    hf_out, lamina_out = hf_logits(out), lamina_logits(out)
    for key in hf_out:
        torch.testing.assert_close(lamina_out[key], hf_out[key], rtol=1e-4, atol=1e-4)


def _compress_with_library(source, out, method: str, layout: str) -> None:
    """Quantize with lamina's RTN, then let compressed-tensors compress and save those integers and scales."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme, apply_quantization_config
    from transformers import AutoModelForCausalLM

    args = get_recipe(method).weight_args(GROUP)
    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
    scheme = QuantizationScheme(targets=["Linear"], weights=weights_dict(args))
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"]))
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "weight_scale"):
                packed = rtn_quantize(module.weight, args, module.weight.dtype)
                module.weight_scale.copy_(packed.scale)
                if packed.zero_point is not None:
                    module.weight_zero_point.copy_(packed.zero_point)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=layout)
    compressor.compress_model(model)
    model.save_pretrained(str(out))
    compressor.update_config(str(out))


@pytest.mark.parametrize("method,layout", CASES)
def test_library_compressed_checkpoints_load_in_lamina_exactly(source, tmp_path, method, layout):
    theirs = tmp_path / "library"
    _compress_with_library(source, theirs, method, layout)
    ours = quantized(source, tmp_path / "lamina", method)
    theirs_weights = dequantized_weights(theirs)
    for name, weight in dequantized_weights(ours).items():
        assert torch.equal(theirs_weights[name], weight), name
    theirs_logits, ours_logits = lamina_logits(theirs), lamina_logits(ours)
    for key in ours_logits:
        assert torch.equal(theirs_logits[key], ours_logits[key])
