"""load_format="dummy": a model from a bare config.json, random weights, no checkpoint or tokenizer;
and the validation of the new engine options."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from lamina import LLM, SamplingParams
from lamina.bench.offline import write_config
from lamina.cli_args import add_engine_args, engine_kwargs
from lamina.config import CacheConfig, EngineConfig, ModelConfig


@pytest.fixture()
def config_path(tmp_path: Path) -> str:
    return str(write_config("tiny", tmp_path))


def _dummy(path: str, **kw: object) -> LLM:
    return LLM(model=path, load_format="dummy", skip_tokenizer_init=True, device="cpu", num_kv_blocks=32, **kw)


def test_dummy_model_generates_from_a_config_file(config_path: str) -> None:
    params = SamplingParams(temperature=0, max_tokens=7, ignore_eos=True)
    out = _dummy(config_path).generate([{"prompt_token_ids": [5, 9000, 17]}, {"prompt_token_ids": [3]}], params,
                                       use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in out] == [7, 7]
    # the config's directory works too (no safetensors needed with load_format="dummy")
    assert _dummy(str(Path(config_path).parent)).engine.arch.vocab_size == 10240


def test_dummy_weights_are_deterministic(config_path: str) -> None:
    first, second = (_dummy(config_path).engine.executor.worker.model.state_dict() for _ in range(2))
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert any(v.std() > 0.01 for k, v in first.items() if not k.endswith("norm.weight"))


def test_config_file_needs_dummy_and_no_tokenizer(config_path: str) -> None:
    with pytest.raises(ValueError, match="load_format='dummy'"):
        ModelConfig(model=config_path, skip_tokenizer_init=True)
    with pytest.raises(ValueError, match="skip_tokenizer_init"):
        ModelConfig(model=config_path, load_format="dummy")
    with pytest.raises(ValueError, match="does not exist"):
        _dummy(config_path.replace("config.json", "missing.json"))


@pytest.mark.parametrize("make, field", [
    (lambda: ModelConfig(model="m", load_format="pt"), "load_format"),
    (lambda: CacheConfig(gpu_memory_utilization=0), "gpu_memory_utilization"),
    (lambda: CacheConfig(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
    (lambda: CacheConfig(gpu_memory_utilization=True), "gpu_memory_utilization"),
    (lambda: EngineConfig(ModelConfig(model="m"), enforce_eager="yes"), "enforce_eager"),
    (lambda: EngineConfig(ModelConfig(model="m"), cuda_graph_max_batch_size=0), "cuda_graph_max_batch_size"),
    (lambda: EngineConfig(ModelConfig(model="m"), cuda_graph_prefill_tokens=-1), "cuda_graph_prefill_tokens"),
    (lambda: EngineConfig(ModelConfig(model="m"), cuda_graph_prefill_tokens=1.5), "cuda_graph_prefill_tokens"),
])
def test_validation_names_the_field(make, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        make()


def test_cli_flags(config_path: str) -> None:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--load-format", "dummy", "--gpu-memory-utilization", "0.5", "--enforce-eager",
                              "--cuda-graph-max-batch-size", "64", "--cuda-graph-prefill-tokens", "0"])
    kwargs = engine_kwargs(args)
    assert (kwargs["load_format"], kwargs["gpu_memory_utilization"], kwargs["enforce_eager"],
            kwargs["cuda_graph_max_batch_size"], kwargs["cuda_graph_prefill_tokens"]) == ("dummy", 0.5, True, 64, 0)
    assert json.loads(Path(config_path).read_text())["architectures"] == ["Qwen3ForCausalLM"]
