"""kv_cache_dtype="fp8": e4m3 K/V with per-head scales (from the checkpoint, else measured at start-up), on the
CPU path (the kernels: tests/kernels/test_fp8_kv.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lamina import LLM, SamplingParams
from lamina.config import CacheConfig, EngineConfig, ModelConfig
from lamina.kv import fp8_scales
from lamina.kv.cache import attention_layers
from lamina.loader.hf_config import load_model_arch
from lamina.loader.model_loader import load_model
from tests.helpers.tiny_models import make_tiny_model

PROMPTS = [{"prompt_token_ids": [(7 * i + j) % 250 for i in range(20 + 3 * j)]} for j in range(4)]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def model_layers(llm: LLM) -> list:
    return attention_layers(llm.engine.executor.worker.model)


def tokens(llm: LLM, prompts: list = PROMPTS) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


def test_fp8_holds_four_times_the_blocks_and_keeps_the_engines_invariants(tmp_path: Path) -> None:
    """A float32 model (the CPU's dtype): e4m3 takes a quarter of the bytes. The same bytes are written and read
    whatever the schedule, so the prefix cache on / off and chunked / whole prompts give the same tokens."""
    model = str(make_tiny_model("llama", tmp_path / "m", vocab_size=256))
    common = dict(model=model, skip_tokenizer_init=True, kv_cache_memory_bytes=1 << 20)
    auto = LLM(**common)
    fp8 = LLM(**common, kv_cache_dtype="fp8")
    assert fp8.engine.num_blocks == 4 * auto.engine.num_blocks
    assert model_layers(fp8)[0].kv_cache[0].dtype == torch.float8_e4m3fn
    want = tokens(fp8)
    shared = [{"prompt_token_ids": PROMPTS[3]["prompt_token_ids"][:32] + [9, 8, 7]}]  # a 2-block prefix hit
    uncached = LLM(**common, kv_cache_dtype="fp8", enable_prefix_caching=False)
    assert tokens(fp8, shared) == tokens(uncached, shared)
    assert tokens(uncached) == want
    chunked = LLM(**common, kv_cache_dtype="fp8", max_num_batched_tokens=8)
    assert tokens(chunked) == want
    assert fp8.engine.get_stats().prefix_cache_hit_rate > 0
    for llm in (auto, fp8, uncached, chunked):
        llm.engine.check_integrity()


def test_fp8_is_close_to_the_models_dtype_and_not_equal(tmp_path: Path) -> None:
    """Prompt log-probabilities through an fp8 cache stay near those of the float32 one (a cache read without
    its scale, or a misrounded store, moves them by far more), and differ (the cache is really e4m3)."""
    model = str(make_tiny_model("qwen3", tmp_path / "m", vocab_size=256))
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    logprobs = []
    for kv in ("auto", "fp8"):
        llm = LLM(model=model, skip_tokenizer_init=True, kv_cache_dtype=kv)
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
        llm.engine.check_integrity()
        logprobs.append([next(iter(e.values())).logprob for o in outs for e in o.prompt_logprobs[1:]])
    diffs = [abs(a - b) for a, b in zip(*logprobs)]
    assert 0 < sum(diffs) / len(diffs) < 0.2


def test_scales_come_from_the_checkpoint_where_it_has_them(tmp_path: Path) -> None:
    """self_attn.k_scale / v_scale: one per KV head or one for all; the layers without them are measured."""
    model = make_tiny_model("llama", tmp_path / "m", vocab_size=256)
    weights = load_file(model / "model.safetensors")
    weights["model.layers.0.self_attn.k_scale"] = torch.tensor([0.5, 0.25])
    weights["model.layers.0.self_attn.v_scale"] = torch.tensor(0.125)
    save_file(weights, model / "model.safetensors")
    llm = LLM(model=str(model), skip_tokenizer_init=True, kv_cache_dtype="fp8")
    first, second = model_layers(llm)
    assert first.k_scale.tolist() == [0.5, 0.25] and first.v_scale.tolist() == [0.125, 0.125]
    assert first.kv_scales_loaded and not second.kv_scales_loaded and (second.k_scale != 1).all()
    tokens(llm)
    llm.engine.check_integrity()
    weights["model.layers.0.self_attn.k_scale"] = torch.tensor([0.5, 0.25, 1.0])
    save_file(weights, model / "model.safetensors")
    with pytest.raises(ValueError, match="model.layers.0.self_attn.k_scale.*3 scales, expected 1 or one per KV"):
        LLM(model=str(model), skip_tokenizer_init=True, kv_cache_dtype="fp8")


def test_start_up_scales_are_headroom_times_the_measured_range(tmp_path: Path) -> None:
    """The scales are HEADROOM * max |k| / 448 per KV head over the calibration's own forwards (seen here by a
    second hook on the same calls), for every layer the checkpoint left without."""
    path = str(make_tiny_model("qwen3", tmp_path / "m", vocab_size=256))
    arch = load_model_arch(path)
    model = load_model(path, arch, torch.float32, "cpu", attention_backend="torch")
    seen: dict[int, torch.Tensor] = {}

    def record(module, args, output) -> None:  # noqa: ANN001
        heads = torch.stack([x.reshape(x.shape[0], module.num_kv_heads, -1).abs().amax(dim=(0, 2)) for x in args[1:3]])
        seen[id(module)] = torch.maximum(seen.get(id(module), heads), heads)

    hooks = [layer.register_forward_hook(record) for layer in attention_layers(model)]
    assert fp8_scales.calibrate_kv_scales(model, arch, torch.float32, torch.device("cpu")) == 2
    for hook in hooks:
        hook.remove()
    for layer in attention_layers(model):
        expected = fp8_scales.HEADROOM * seen[id(layer)] / fp8_scales.FP8_MAX
        torch.testing.assert_close(torch.stack([layer.k_scale, layer.v_scale]), expected)
    assert fp8_scales.calibrate_kv_scales(model, arch, torch.float32, torch.device("cpu")) == 2  # none loaded


def test_bad_kv_cache_dtypes_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype: must be one of"):
        CacheConfig(kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="kv_cache_dtype: 'fp8' with tensor_parallel_size > 1"):
        EngineConfig(ModelConfig(model=str(tmp_path)), CacheConfig(kv_cache_dtype="fp8"), tensor_parallel_size=2)
    assert json.dumps(CacheConfig(kv_cache_dtype="fp8_e4m3").kv_cache_dtype) == '"fp8_e4m3"'
