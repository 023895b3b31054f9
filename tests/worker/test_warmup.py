"""The kernel warm-up: its batches fit the engine's limits, and its forwards leave the KV cache as it was."""
from __future__ import annotations

import pytest
import torch

import tests.kernels.conftest  # noqa: F401 - TRITON_INTERPRET=1 and the interpreter fixes
from lamina import LLM
from lamina.kernels.tiles import LONG_QUERY
from lamina.kv.cache import attention_layers
from lamina.worker.warmup import warm_up_kernels, warmup_batches
from tests.helpers.tiny_models import make_tiny_model


@pytest.mark.parametrize("budget,max_len", [(8192, 4096), (2048, 40960), (64, 64), (16, 4096)])
def test_batches_fit_the_budget_and_cover_both_prefill_tiles(budget: int, max_len: int) -> None:
    batches = warmup_batches(budget, max_len)
    assert batches
    for rows in batches:
        assert sum(q for q, _ in rows) <= budget and all(1 <= q <= s <= max_len for q, s in rows)
    longest = max(q for rows in batches for q, _ in rows)
    assert (longest >= LONG_QUERY) == (min(budget - 2, max_len) >= LONG_QUERY)
    assert [len(rows) for rows in batches if all(q == 1 for q, _ in rows)][-8:] == list(range(1, 9))  # GEMV M=1..8


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_warm_up_stores_nothing(tmp_path, backend: str) -> None:
    model_dir = make_tiny_model("qwen3", tmp_path, hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
                                head_dim=32, num_hidden_layers=1)
    llm = LLM(model=str(model_dir), skip_tokenizer_init=True, device="cpu", attention_backend=backend,
              block_size=8, num_kv_blocks=32, max_model_len=64, max_num_batched_tokens=80)
    worker = llm.engine.executor.worker
    caches = [layer.kv_cache for layer in attention_layers(worker.model)]
    for k, v in caches:
        k.normal_(), v.normal_()
    before = [(k.clone(), v.clone()) for k, v in caches]
    warm_up_kernels(worker.model, 8, 80, 64, torch.device("cpu"))
    for (k, v), (k0, v0) in zip(caches, before):
        assert torch.equal(k, k0) and torch.equal(v, v0)
