"""compressed-tensors' `kv_cache_scheme` (static fp8 KV scales, as llm-compressor writes them) against the real
library: a checkpoint that compressed-tensors saves with only KV scales is run by transformers, which fake-quantizes
K and V with them, and by lamina with kv_cache_dtype="fp8", which stores e4m3 with the same scales: the same
log-probabilities."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from lamina import LLM, SamplingParams
from lamina.kv.cache import attention_layers
from lamina.quant.config import parse_quant_config
from tests.helpers.hf_oracle import hf_prompt_logprobs
from tests.helpers.tiny_models import make_tiny_model

pytest.importorskip("compressed_tensors")

PROMPTS = [[(11 * i + 3 * j + 1) % 250 for i in range(24 + 5 * j)] for j in range(3)]
K_SCALE, V_SCALE = 0.05, 0.03  # far from what the start-up measurement would pick: a scale ignored shows
KV_SCHEME = {"num_bits": 8, "type": "float", "strategy": "attn_head", "dynamic": False, "symmetric": True}


def _library_checkpoint(source: Path, out: Path, strategy: str) -> None:
    """The KV scales alone, set and saved by compressed-tensors (config_groups empty, format "dense")."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, apply_quantization_config
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
    args = QuantizationArgs(**{**KV_SCHEME, "strategy": strategy})
    apply_quantization_config(model, QuantizationConfig(config_groups={}, kv_cache_scheme=args))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("k_scale", "v_scale")):
                heads = torch.linspace(1.0, 1.5, param.numel()).reshape(param.shape)  # per head where it can be
                param.copy_(heads * (K_SCALE if name.endswith("k_scale") else V_SCALE))
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(str(out))
    compressor.update_config(str(out))


def _hf_logprobs(model_dir: Path) -> list[list[float]]:
    return hf_prompt_logprobs(str(model_dir), PROMPTS)


def _lamina_logprobs(llm: LLM) -> list[list[float]]:
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": ids} for ids in PROMPTS], params, use_tqdm=False)
    return [[next(iter(entry.values())).logprob for entry in o.prompt_logprobs[1:]] for o in outs]


def _max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kv") / "fp32"
    make_tiny_model("llama", path, vocab_size=256, hidden_size=128, head_dim=32, initializer_range=0.2)
    return path


@pytest.mark.parametrize("strategy", ["attn_head", "tensor"])
def test_library_fp8_kv_checkpoint_runs_as_in_transformers(source: Path, tmp_path: Path, strategy: str) -> None:
    out = tmp_path / strategy
    _library_checkpoint(source, out, strategy)
    assert json.loads((out / "config.json").read_text())["quantization_config"]["kv_cache_scheme"]["strategy"] \
        == strategy
    theirs = _hf_logprobs(out)
    llm = LLM(model=str(out), skip_tokenizer_init=True, kv_cache_dtype="fp8")
    layers = attention_layers(llm.engine.executor.worker.model)
    assert all(layer.kv_scales_loaded for layer in layers)  # the checkpoint's, not measured at start-up
    ours = _lamina_logprobs(llm)
    llm.engine.check_integrity()
    plain = LLM(model=str(out), skip_tokenizer_init=True)  # kv_cache_dtype "auto": float32 K/V, scales unused
    unquantized = _lamina_logprobs(plain)
    plain.engine.check_integrity()
    assert _max_diff(unquantized, theirs) > 20 * _max_diff(ours, theirs)  # the fp8 rounding is visible ...
    assert _max_diff(ours, theirs) < 1e-3  # ... and lamina's is transformers + compressed-tensors'


def test_auto_cache_keeps_the_models_dtype_and_says_the_scales_are_there(source: Path, tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "kv"
    _library_checkpoint(source, out, "attn_head")
    with caplog.at_level(logging.INFO, logger="lamina.worker.worker"):
        llm = LLM(model=str(out), skip_tokenizer_init=True)
    worker = llm.engine.executor.worker
    assert worker.kv_dtype == torch.float32
    assert any("kv_cache_dtype='fp8' would use them" in r.message for r in caplog.records)
    llm.engine.check_integrity()


def _config(**kv: object) -> dict:
    return {"quant_method": "compressed-tensors", "format": "dense", "quantization_status": "compressed",
            "config_groups": {}, "kv_cache_scheme": {**KV_SCHEME, **kv}}


def test_kv_only_config_quantizes_no_linear() -> None:
    config = parse_quant_config(_config())
    assert config.kv_cache_scheme == "fp8" and config.schemes == ()
    assert config.args_for("QKVParallelLinear", ["model.layers.0.self_attn.q_proj"]) is None


@pytest.mark.parametrize("field,value", [("type", "int"), ("num_bits", 4), ("dynamic", True), ("symmetric", False),
                                         ("strategy", "channel"), ("group_size", 64)])
def test_kv_schemes_lamina_does_not_run_are_refused_by_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"quantization_config.kv_cache_scheme.{field}"):
        parse_quant_config(_config(**{field: value}))


def test_empty_config_groups_without_kv_scheme_are_still_refused() -> None:
    with pytest.raises(ValueError, match="config_groups"):
        parse_quant_config({**_config(), "kv_cache_scheme": None})
