"""config.json parsing: both transformers layouts, defaults, and the errors users can cause."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from lamina.loader.hf_config import check_model_len, load_generation_config, load_model_arch
from lamina.models.registry import get_model_class, supported_architectures
from tests.helpers.tiny_models import make_tiny_model

SUPPORTED = ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"]
LLAMA_4X = {  # as transformers 4.x wrote it
    "architectures": ["LlamaForCausalLM"], "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "torch_dtype": "bfloat16", "bos_token_id": 1,
    "eos_token_id": [2, 3],
    "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
}


def write_config(tmp_path: Path, config: dict, name: str = "m") -> str:
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def test_registry_lists_the_four_architectures() -> None:
    assert supported_architectures() == SUPPORTED
    for name in SUPPORTED:
        assert get_model_class(name).__name__ == name
    with pytest.raises(ValueError, match="'GPT2LMHeadModel' is not supported.*LlamaForCausalLM"):
        get_model_class("GPT2LMHeadModel")


@pytest.mark.parametrize("kind,arch_name,bias", [("llama3", "LlamaForCausalLM", False),
                                                 ("mistral", "MistralForCausalLM", False),
                                                 ("qwen2", "Qwen2ForCausalLM", True),
                                                 ("qwen3", "Qwen3ForCausalLM", False)])
def test_transformers_5_layout(tmp_path: Path, kind: str, arch_name: str, bias: bool) -> None:
    arch = load_model_arch(str(make_tiny_model(kind, tmp_path / kind)))
    assert arch.architecture == arch_name
    assert (arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim) == (4, 2, 16)
    assert arch.attention_bias is bias  # Qwen2 always has a q/k/v bias
    assert arch.torch_dtype == "float32" and arch.eos_token_ids == (2,)
    assert arch.sliding_window == (512 if kind == "mistral" else None)
    if kind == "llama3":
        assert arch.rope_theta == 500000.0
        assert arch.rope_scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    else:
        assert arch.rope_theta == 10000.0 and arch.rope_scaling is None


def test_transformers_4_layout_and_defaults(tmp_path: Path) -> None:
    arch = load_model_arch(write_config(tmp_path, LLAMA_4X))
    assert arch.num_key_value_heads == 4 and arch.head_dim == 16  # defaults: heads, hidden / heads
    assert arch.rope_theta == 500000.0 and arch.rope_scaling["rope_type"] == "llama3"
    assert "type" not in arch.rope_scaling
    assert arch.torch_dtype == "bfloat16" and arch.eos_token_ids == (2, 3)
    assert arch.tie_word_embeddings is False and arch.sliding_window is None
    assert arch.raw["rope_scaling"]["type"] == "llama3"


def test_qwen2_sliding_window_is_ignored_unless_enabled(tmp_path: Path) -> None:
    base = {**LLAMA_4X, "architectures": ["Qwen2ForCausalLM"], "rope_scaling": None, "sliding_window": 4096}
    assert load_model_arch(write_config(tmp_path, {**base, "use_sliding_window": False}, "a")).sliding_window is None
    assert load_model_arch(write_config(tmp_path, {**base, "use_sliding_window": True}, "b")).sliding_window == 4096


def test_generation_config(tmp_path: Path) -> None:
    path = make_tiny_model("llama", tmp_path / "m")
    assert load_generation_config(str(path))["eos_token_id"] == 2
    (path / "generation_config.json").unlink()
    assert load_generation_config(str(path)) == {}


def test_sliding_window_shorter_than_max_model_len_is_refused(tmp_path: Path) -> None:
    arch = load_model_arch(str(make_tiny_model("mistral", tmp_path / "m", sliding_window=64)))
    check_model_len(arch, 64)
    with pytest.raises(ValueError, match=r"sliding_window=64.*lower max_model_len to at most 64"):
        check_model_len(arch, 65)
    with pytest.raises(ValueError, match="max_model_len must be a positive integer"):
        check_model_len(arch, 0)


@pytest.mark.parametrize("edit,message", [
    ({"architectures": ["GPT2LMHeadModel"]}, r"'GPT2LMHeadModel' is not supported; supported .*Qwen3ForCausalLM"),
    ({"architectures": []}, "no `architectures` field"),
    ({"hidden_size": None}, r"missing required field\(s\) \['hidden_size'\]"),
    ({"num_key_value_heads": 3}, r"num_attention_heads \(4\) must be a multiple of num_key_value_heads \(3\)"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, r"'yarn' is not supported.*'llama3'"),
    ({"partial_rotary_factor": 0.5}, r"partial_rotary_factor: only 1.0 is supported, got 0.5"),
    ({"hidden_act": "gelu"}, "hidden_act: only 'silu'"),
    ({"quantization_config": {"quant_method": "bitsandbytes"}}, "quantization_config.*'bitsandbytes'"),
])
def test_bad_config_is_a_clear_error(tmp_path: Path, edit: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_model_arch(write_config(tmp_path, {**LLAMA_4X, **edit}))


def test_bad_paths_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_model_arch(str(tmp_path / "nope"))
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ValueError, match="is not a directory"):
        load_model_arch(str(tmp_path / "file.txt"))
    with pytest.raises(ValueError, match="no config.json"):
        load_model_arch(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="invalid JSON"):
        load_model_arch(str(tmp_path))
