"""Build argparse flags from the config and SamplingParams dataclass fields (one source of truth)."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from lamina.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from lamina.sampling_params import SamplingParams

if TYPE_CHECKING:  # the engine pulls in torch
    from lamina.engine.engine import LLMEngine

_ENGINE_CONFIGS = (ModelConfig, CacheConfig, SchedulerConfig, EngineConfig)
_NESTED = {"model_config", "cache_config", "scheduler_config"}
# output_kind: the commands pick how they read outputs (they stream text themselves); not a user setting.
_SKIPPED = {"model", "stop_list", "n", "output_kind"}


# SamplingParams fields whose flag would clash with an engine flag.
_SAMPLING_RENAMES = {"seed": "sampling_seed"}


_HELP = {
    "dtype": "auto | float32 | bfloat16 | float16 (auto: float32 on CPU, the checkpoint's dtype on GPU)",
    "max_model_len": "longest prompt + output in tokens (default: the model's limit, capped by the KV cache)",
    "seed": "engine seed for requests without their own --sampling-seed",
    "skip_tokenizer_init": "load no tokenizer (prompts must be token ids)",
    "tokenizer": "tokenizer directory (default: the model directory)",
    "max_logprobs": "the most --logprobs a request may ask for",
    "block_size": "tokens per KV cache block",
    "num_kv_blocks": "KV cache size in blocks (wins over --kv-cache-memory-bytes)",
    "kv_cache_memory_bytes": "KV cache size in bytes (default on CPU: 1 GiB)",
    "kv_cache_dtype": "auto | fp8 (e4m3 K/V, one byte an element: per-head scales from the checkpoint, else "
                      "measured at start-up)",
    "enable_prefix_caching": "reuse the KV of shared prompt prefixes (radix tree over blocks)",
    "max_num_batched_tokens": "token budget of one engine step (longer prompts are chunked)",
    "max_num_seqs": "most requests running at once",
    "device": "auto | cpu | cuda",
    "attention_backend": "auto | torch | triton (auto: triton on CUDA, torch elsewhere)",
    "load_format": "auto | dummy (dummy: random weights from config.json, no checkpoint; model may be a .json)",
    "gpu_memory_utilization": "CUDA: share of GPU memory for weights, activations and the KV cache, in (0, 1]",
    "enforce_eager": "never capture CUDA graphs (decode batches are captured on CUDA with the triton backend)",
    "cuda_graph_max_batch_size": "largest decode batch captured as a CUDA graph",
    "cuda_graph_prefill_tokens": "prompt chunks of 1, 2 or 4 requests up to this many tokens replay CUDA graphs "
                                 "(0: eager)",
    "async_scheduling": "launch the next decode step while the host processes the current one's tokens",
    "enable_pdl": "on sm_90+ GPUs, start each Triton kernel of a step while the one before it finishes "
                  "(programmatic dependent launch)",
    "tensor_parallel_size": "split the model over this many processes, one per GPU (CPU: gloo); docs/distributed.md",
    "speculative_config": 'speculative decoding as JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 3}\'',
    "temperature": "0 = greedy",
    "top_k": "0 or -1 = off",
    "sampling_seed": "seed of this request's own random generator",
    "max_tokens": "most tokens to generate",
    "logprobs": "return the top-N logprobs of each generated token",
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _scalar_type(hint: str) -> type | None:
    for name, typ in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if hint.startswith(name):
            return typ
    return None


def _add_field(group: argparse._ArgumentGroup, field: dataclasses.Field, default: object,
               name: str | None = None) -> None:
    hint, flag = str(field.type), _flag(name or field.name)
    help_text = _HELP.get(name or field.name, "")
    if hint.startswith("bool"):
        group.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        return
    if "list[" in hint:
        group.add_argument(flag, nargs="+", type=str if "str" in hint else int, default=None, help=help_text)
        return
    if default is not None:
        help_text = f"{help_text} (default: {default})" if help_text else f"default: {default}"
    group.add_argument(flag, type=_scalar_type(hint) or str, default=default, help=help_text)


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine")
    for cls in _ENGINE_CONFIGS:
        for field in dataclasses.fields(cls):
            if field.name in _SKIPPED or field.name in _NESTED:
                continue
            default = field.default if field.default is not dataclasses.MISSING else None
            _add_field(group, field, default)


def add_sampling_args(parser: argparse.ArgumentParser, defaults: dict | None = None) -> None:
    group = parser.add_argument_group("sampling")
    defaults = defaults or {}
    for field in dataclasses.fields(SamplingParams):
        if not field.init or field.name in _SKIPPED:
            continue
        default = defaults.get(field.name, field.default)
        if field.name == "stop":
            group.add_argument("--stop", action="append", default=None, help="a stop string (repeatable)")
            continue
        _add_field(group, field, default, _SAMPLING_RENAMES.get(field.name))


def engine_kwargs(args: argparse.Namespace) -> dict:
    names = [f.name for cls in _ENGINE_CONFIGS for f in dataclasses.fields(cls)
             if f.name not in _SKIPPED and f.name not in _NESTED]
    return {name: getattr(args, name) for name in names}


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    names = [f.name for f in dataclasses.fields(SamplingParams) if f.init and f.name not in _SKIPPED]
    return SamplingParams(**{name: getattr(args, _SAMPLING_RENAMES.get(name, name)) for name in names})


def _effective(engine: LLMEngine, name: str) -> object:
    """A scheduler setting as the engine runs it: the scheduler's own config first (where defaults that
    depend on the device are resolved), then the engine config; "auto" if neither holds a value."""
    scheduler = getattr(engine, "scheduler", None)
    for config in (getattr(scheduler, "config", None), getattr(engine.config, "scheduler_config", None)):
        value = getattr(config, name, None)
        if value is not None:
            return value
    return "auto"


def engine_summary(engine: LLMEngine) -> str:
    """One line for the start-up log: what runs where, and the settings a user did not have to type.

        model demo-model (/path): float32 on cpu, max_model_len 1024, KV cache 65,520 tokens (4,096 blocks
        of 16), max_num_seqs 128, max_num_batched_tokens 2048, prefix caching on
    """
    model = engine.config.model_config.model
    cache = engine.config.cache_config
    dtype = str(getattr(engine, "dtype", "?")).removeprefix("torch.")
    blocks, tokens = getattr(engine, "num_blocks", None), getattr(engine, "kv_capacity_tokens", None)
    kv = "KV cache ?"
    if blocks is not None and tokens is not None:
        kv = f"KV cache {tokens:,} tokens ({blocks:,} blocks of {cache.block_size})"
    return (f"model {Path(model).name} ({model}): {dtype} on {getattr(engine, 'device', '?')}, max_model_len "
            f"{engine.max_model_len}, {kv}, max_num_seqs {_effective(engine, 'max_num_seqs')}, "
            f"max_num_batched_tokens {_effective(engine, 'max_num_batched_tokens')}, "
            f"prefix caching {'on' if cache.enable_prefix_caching else 'off'}")


__all__ = ["add_engine_args", "add_sampling_args", "engine_kwargs", "engine_summary", "sampling_params"]
