"""FP8 checkpoints with one weight scale per tensor and, as llm-compressor's FP8 scheme writes them, one static
input scale per layer: written by compressed-tensors itself, run by transformers and by lamina alike."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lamina import LLM
from tests.helpers.fp8_checkpoints import fp8_per_tensor_checkpoint
from tests.helpers.tiny_models import make_tiny_model
from tests.quant.test_kv_cache_scheme import _hf_logprobs, _lamina_logprobs, _max_diff

pytest.importorskip("compressed_tensors")

INPUT_SCALES = {"q_proj": 0.05, "k_proj": 0.05, "v_proj": 0.05, "o_proj": 0.02, "gate_proj": 0.04,
                "up_proj": 0.04, "down_proj": 0.01}  # a fused layer's shards see the same input: the same scale


def _library_checkpoint(source: Path, out: Path, static_input: bool) -> None:
    scale = (lambda name: INPUT_SCALES[name.rsplit(".", 1)[1]]) if static_input else None
    fp8_per_tensor_checkpoint(source, out, scale)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fp8") / "fp32"
    make_tiny_model("llama", path, vocab_size=256, hidden_size=128, head_dim=32, initializer_range=0.2)
    return path


@pytest.mark.parametrize("static_input", [True, False])
def test_library_per_tensor_fp8_checkpoints_run_as_in_transformers(source: Path, tmp_path: Path,
                                                                   static_input: bool) -> None:
    out = tmp_path / "fp8"
    _library_checkpoint(source, out, static_input)
    group = json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]["group_0"]
    assert group["weights"]["strategy"] == "tensor" and group["input_activations"]["dynamic"] is not static_input
    llm = LLM(model=str(out), skip_tokenizer_init=True)
    qkv = llm.engine.executor.worker.model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight_scale.unique().numel() == 3  # each shard's own scale over its rows
    ours = _lamina_logprobs(llm)
    llm.engine.check_integrity()
    theirs = _hf_logprobs(out)
    diffs = sorted(abs(a - b) for row_a, row_b in zip(ours, theirs) for a, b in zip(row_a, row_b))
    # the same e4m3 roundings: equal to float32 noise but where x / s lands on a rounding boundary (1 of 84 here,
    # 1.8e-3); reading the static input scale as a per-token one moves the median by 1.3
    assert diffs[len(diffs) // 2] < 1e-4 and diffs[-1] < 1e-2
    assert _max_diff(_hf_logprobs(source), theirs) > 0.1  # the quantization is visible


def test_a_fused_layer_takes_the_largest_input_scale_of_its_shards(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "fp8"
    _library_checkpoint(source, out, static_input=True)
    weights = load_file(str(out / "model.safetensors"))
    weights["model.layers.0.self_attn.k_proj.input_scale"] = torch.tensor([0.07])
    save_file(weights, str(out / "model.safetensors"))
    llm = LLM(model=str(out), skip_tokenizer_init=True)
    attention = llm.engine.executor.worker.model.model.layers[0].self_attn
    assert attention.qkv_proj.static_input_scale.item() == pytest.approx(0.07)
    assert attention.o_proj.static_input_scale.item() == pytest.approx(0.02)
    llm.engine.check_integrity()


@pytest.mark.parametrize("tensor,value,message", [
    ("self_attn.o_proj.input_scale", torch.tensor([0.0]), r"layers\.1\.self_attn\.o_proj: input_scale: positive"),
    ("self_attn.o_proj.input_scale", torch.tensor([0.1, 0.2]), "input_scale: one scale per tensor was expected"),
    ("mlp.down_proj.weight_scale", torch.ones(128, 1), "weight_scale: one scale per tensor was expected"),
])
def test_bad_per_tensor_scales_are_refused_by_name(source: Path, tmp_path: Path, tensor: str, value: torch.Tensor,
                                                   message: str) -> None:
    out = tmp_path / "fp8"
    _library_checkpoint(source, out, static_input=True)
    weights = load_file(str(out / "model.safetensors"))
    weights[f"model.layers.1.{tensor}"] = value
    save_file(weights, str(out / "model.safetensors"))
    with pytest.raises(ValueError, match=message):
        LLM(model=str(out), skip_tokenizer_init=True)
