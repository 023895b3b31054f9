"""Worker: loads the model, sizes and allocates the paged KV cache, owns the ModelRunner."""
from __future__ import annotations

import logging

import torch

from lamina.config import DEFAULT_CPU_KV_BYTES, EngineConfig
from lamina.engine.interfaces import ModelRunnerOutput, SchedulerOutput
from lamina.kv.cache import allocate_kv_caches, bind_kv_caches, kv_cache_bytes_per_block
from lamina.loader.hf_config import ModelArch, check_model_len
from lamina.loader.model_loader import load_model
from lamina.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' was asked for but no CUDA GPU is available; use 'cpu' or 'auto'")
    return torch.device(name)


def resolve_dtype(name: str, arch: ModelArch, device: torch.device) -> torch.dtype:
    """"auto" runs the checkpoint's dtype on a GPU and float32 on the CPU (exact and fast there)."""
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cpu":
        return torch.float32
    return _DTYPES.get(arch.torch_dtype or "", torch.bfloat16)


class Worker:
    def __init__(self, config: EngineConfig, arch: ModelArch) -> None:
        self.config = config
        self.arch = arch
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.model_config.dtype, arch, self.device)
        cache = config.cache_config
        self.model = load_model(config.model_config.model, arch, self.dtype, self.device,
                                attention_backend=config.attention_backend)
        self.num_blocks = self._num_kv_blocks()
        self.kv_capacity_tokens = (self.num_blocks - 1) * cache.block_size
        self.max_model_len = self._max_model_len()
        check_model_len(arch, self.max_model_len)
        caches = allocate_kv_caches(arch, self.num_blocks, cache.block_size, self.dtype, self.device)
        bind_kv_caches(self.model, caches)
        logger.info("KV cache: %d blocks of %d tokens (%d tokens), max_model_len %d, %s on %s",
                    self.num_blocks, cache.block_size, self.kv_capacity_tokens, self.max_model_len,
                    self.dtype, self.device)
        self.runner = ModelRunner(self.model, cache.block_size, arch.vocab_size, self.device,
                                  config.model_config.seed)

    def _num_kv_blocks(self) -> int:
        cache = self.config.cache_config
        if cache.num_kv_blocks is not None:
            return cache.num_kv_blocks
        budget = cache.kv_cache_memory_bytes or DEFAULT_CPU_KV_BYTES
        per_block = kv_cache_bytes_per_block(self.arch, cache.block_size, self.dtype)
        num_blocks = budget // per_block
        if num_blocks < 2:
            raise ValueError(f"kv_cache_memory_bytes: {budget} bytes hold {num_blocks} KV blocks of "
                             f"{per_block} bytes; at least 2 are needed (block 0 is reserved)")
        return int(num_blocks)

    def _max_model_len(self) -> int:
        asked = self.config.model_config.max_model_len
        limit = self.arch.max_position_embeddings
        if asked is None:
            # Full attention is exact only within a sliding window: stay inside it unless asked.
            window = self.arch.sliding_window or limit
            return min(limit, window, self.kv_capacity_tokens)
        if asked > limit:
            raise ValueError(f"max_model_len: {asked} is larger than the model's max_position_embeddings "
                             f"({limit})")
        if asked > self.kv_capacity_tokens:
            raise ValueError(f"max_model_len: {asked} tokens do not fit in the KV cache "
                             f"({self.kv_capacity_tokens} tokens); raise num_kv_blocks or "
                             f"kv_cache_memory_bytes, or lower max_model_len")
        return asked

    def execute(self, scheduled: SchedulerOutput) -> ModelRunnerOutput:
        return self.runner.execute(scheduled)
