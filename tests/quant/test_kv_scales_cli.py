"""`lamina quantize --kv-cache-scheme fp8`: per-head fp8 KV scales measured on the calibration text, written as
compressed-tensors' kv_cache_scheme, run alike by lamina and transformers, and scored by the gate with the fp8
cache they run with."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from lamina import LLM
from lamina.cli import main
from lamina.kv.cache import attention_layers
from tests.quant.helpers import tiny_model
from tests.quant.test_calibrated_cli import LOOSE
from tests.quant.test_calibrated_cli import files as files  # noqa: F401, PLC0414 - a fixture
from tests.quant.test_kv_cache_scheme import _hf_logprobs, _lamina_logprobs, _max_diff

pytest.importorskip("compressed_tensors")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("kvcli") / "fp32")


def _quantize(model, out, files, kv: bool) -> int:
    text, calib = files
    extra = ["--kv-cache-scheme", "fp8", "--calib", calib, "--num-samples", "6"] if kv else []
    return main(["quantize", str(model), "--method", "int8", "--output", str(out), "--eval-text", text,
                 "--window", "64", "--code-cases", "4", "--no-progress", *LOOSE, *extra])


@pytest.fixture(scope="module")
def with_kv(model, files, tmp_path_factory):
    out = tmp_path_factory.mktemp("kvq") / "int8-kv"
    assert _quantize(model, out, files, kv=True) == 0
    return out


def test_the_checkpoint_carries_per_head_scales_and_says_how_they_were_made(with_kv) -> None:
    config = json.loads((with_kv / "config.json").read_text())
    scheme = config["quantization_config"]["kv_cache_scheme"]
    assert (scheme["type"], scheme["num_bits"], scheme["strategy"], scheme["dynamic"]) == ("float", 8, "attn_head",
                                                                                         False)
    weights = load_file(str(with_kv / "model.safetensors"))
    for layer in range(config["num_hidden_layers"]):
        for which in ("k_scale", "v_scale"):
            scale = weights[f"model.layers.{layer}.self_attn.{which}"]
            assert scale.shape == (config["num_key_value_heads"], 1, 1) and bool((scale > 0).all())
    summary = json.loads((with_kv / "quantize_summary.json").read_text())
    assert summary["kv_cache_scheme"]["layers"] == config["num_hidden_layers"]
    assert summary["kv_cache_scheme"]["calibration"]["sequences"] == 6


def test_lamina_and_transformers_run_the_scales_alike(with_kv) -> None:
    llm = LLM(model=str(with_kv), skip_tokenizer_init=True, kv_cache_dtype="fp8")
    assert all(layer.kv_scales_loaded for layer in attention_layers(llm.engine.executor.worker.model))
    ours = _lamina_logprobs(llm)
    llm.engine.check_integrity()
    plain = LLM(model=str(with_kv), skip_tokenizer_init=True)
    unquantized = _lamina_logprobs(plain)
    plain.engine.check_integrity()
    theirs = _hf_logprobs(with_kv)
    assert _max_diff(ours, theirs) < 1e-3
    assert _max_diff(unquantized, theirs) > 0  # transformers really ran the fp8 K/V


def test_the_text_scales_are_not_the_start_up_ones(model, with_kv) -> None:
    measured = LLM(model=str(model), skip_tokenizer_init=True, kv_cache_dtype="fp8")  # random tokens at start-up
    start_up = [layer.k_scale.clone() for layer in attention_layers(measured.engine.executor.worker.model)]
    measured.engine.check_integrity()
    weights = load_file(str(with_kv / "model.safetensors"))
    text = [weights[f"model.layers.{i}.self_attn.k_scale"].reshape(-1) for i in range(len(start_up))]
    assert not all(torch.allclose(a, b) for a, b in zip(start_up, text))


def test_the_gate_scores_with_the_fp8_cache(model, files, with_kv, tmp_path) -> None:
    out = tmp_path / "int8"
    assert _quantize(model, out, files, kv=False) == 0  # the same weights, no KV scales: scored with a float32 cache
    with_fp8 = json.loads((with_kv / "quantize_summary.json").read_text())["evaluation"]
    plain = json.loads((out / "quantize_summary.json").read_text())["evaluation"]
    assert json.loads((out / "config.json").read_text())["quantization_config"]["kv_cache_scheme"] is None
    assert with_fp8["perplexity"] != plain["perplexity"] and with_fp8["kl"] > plain["kl"]


def test_calibration_flags_serve_the_kv_scales_only_when_asked(model, files, tmp_path, capsys) -> None:
    text, calib = files
    code = main(["quantize", str(model), "--method", "int8", "--output", str(tmp_path / "q"), "--eval-text", text,
                 "--calib", calib, "--no-progress"])
    assert code == 2
    assert "--calib: int8 uses no calibration data" in capsys.readouterr().err


def test_a_calibrated_methods_reference_is_scored_with_the_same_fp8_cache(model, files, tmp_path) -> None:
    """gptq is judged against rtn4: under --kv-cache-scheme both carry KV scales from the same text, so the rtn4
    it must beat is rtn4 with the fp8 cache, not without."""
    text, calib = files
    common = ["--group-size", "64", "--eval-text", text, "--window", "64", "--code-cases", "0", "--calib", calib,
              "--num-samples", "6", "--no-progress", *LOOSE, "--force", "--kv-cache-scheme", "fp8"]
    assert main(["quantize", str(model), "--method", "gptq", "--output", str(tmp_path / "g"), *common]) == 0
    assert main(["quantize", str(model), "--method", "rtn4", "--output", str(tmp_path / "r"), *common]) == 0
    gptq = json.loads((tmp_path / "g" / "quantize_summary.json").read_text())
    rtn4 = json.loads((tmp_path / "r" / "quantize_summary.json").read_text())
    assert "fp8 KV cache" in gptq["evaluation"]["engine"]
    assert gptq["reference"]["perplexity"] == rtn4["evaluation"]["perplexity"]
