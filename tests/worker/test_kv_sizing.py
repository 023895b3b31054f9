"""KV sizing from gpu_memory_utilization: the block arithmetic and the warm-up forward (on CPU)."""
from __future__ import annotations

import pytest
import torch

from lamina import LLM
from lamina.bench.offline import write_config
from lamina.kv.cache import attention_layers
from lamina.worker.kv_sizing import blocks_for_utilization, split_tokens, warmup_forward

GiB = 1 << 30


def test_blocks_for_utilization() -> None:
    assert blocks_for_utilization(100 * GiB, 0.9, 10 * GiB, GiB) == 80
    assert blocks_for_utilization(100 * GiB, 0.5, 10 * GiB + 1, GiB) == 39
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        blocks_for_utilization(10 * GiB, 0.5, 6 * GiB, GiB)  # negative budget
    with pytest.raises(ValueError, match="at least 2"):
        blocks_for_utilization(10 * GiB, 0.5, 4 * GiB, GiB // 2 + 1)  # room for 1 block


def test_split_tokens() -> None:
    assert split_tokens(2048, 4096) == [2048]
    assert split_tokens(10, 4) == [4, 4, 2] and split_tokens(8, 4) == [4, 4]


def test_warmup_forward_stores_nothing(tmp_path) -> None:
    llm = LLM(model=str(write_config("tiny", tmp_path)), load_format="dummy", skip_tokenizer_init=True,
              device="cpu", attention_backend="torch", num_kv_blocks=8)
    worker = llm.engine.executor.worker
    warmup_forward(worker.model, worker.arch, 300, 16, 16, torch.float32, torch.device("cpu"))
    caches = [layer.kv_cache for layer in attention_layers(worker.model)]
    assert all(k.shape[0] == 2 and not k.any() and not v.any() for k, v in caches)
