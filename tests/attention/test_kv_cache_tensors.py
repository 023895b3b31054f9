"""KV cache sizing, allocation and binding to the model's attention layers (lamina/kv/cache.py)."""
from __future__ import annotations

import pytest
import torch

from lamina.config import ModelArch
from lamina.kv.cache import (allocate_kv_caches, attention_layers, bind_kv_caches, kv_cache_bytes_per_block,
                             num_blocks_for_bytes)
from lamina.loader.hf_config import load_model_arch
from lamina.loader.model_loader import load_model
from lamina.models.common import CausalLM
from tests.helpers.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def arch_and_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelArch, CausalLM]:
    path = str(make_tiny_model("qwen3", tmp_path_factory.mktemp("q"), num_hidden_layers=3))
    arch = load_model_arch(path)
    return arch, load_model(path, arch, torch.float32, torch.device("cpu"), load_format="dummy")


def test_sizing(arch_and_model: tuple[ModelArch, CausalLM]) -> None:
    arch, _ = arch_and_model
    # 2 (K, V) * 3 layers * 16 tokens * 2 kv heads * 16 head_dim * 2 bytes
    assert kv_cache_bytes_per_block(arch, 16, torch.bfloat16) == 2 * 3 * 16 * 2 * 16 * 2
    per_block = kv_cache_bytes_per_block(arch, 16, torch.float32)
    assert num_blocks_for_bytes(arch, 16, torch.float32, 10 * per_block + per_block - 1) == 10
    with pytest.raises(ValueError, match="at least 2 blocks|needed for 2 blocks"):
        num_blocks_for_bytes(arch, 16, torch.float32, per_block)


def test_allocate_and_bind_in_layer_order(arch_and_model: tuple[ModelArch, CausalLM]) -> None:
    arch, model = arch_and_model
    caches = allocate_kv_caches(arch, 5, 8, torch.float32, "cpu")
    assert len(caches) == 3
    assert caches[0][0].shape == (5, 8, 2, 16) and not caches[0][0].any()
    bind_kv_caches(model, caches)
    layers = attention_layers(model)
    assert [layer.kv_cache for layer in layers] == caches
    assert layers[2] is model.model.layers[2].self_attn.attn
    with pytest.raises(ValueError, match="3 attention layers but 2 KV caches"):
        bind_kv_caches(model, caches[:2])
    with pytest.raises(ValueError, match="num_kv_blocks must be >= 2"):
        allocate_kv_caches(arch, 1, 8, torch.float32, "cpu")
