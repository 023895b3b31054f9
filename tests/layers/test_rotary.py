"""RoPE against HF's own frequency functions and apply_rotary_pos_emb."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from lamina.layers.rotary import RotaryEmbedding, check_rope_scaling, compute_inv_freq

HEAD_DIM, THETA, MAX_POS = 32, 500000.0, 4096
SCALINGS = [
    None,
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 256},
]


def hf_config(scaling: dict | None) -> LlamaConfig:
    rope = {"rope_type": "default", "rope_theta": THETA} if scaling is None else {**scaling, "rope_theta": THETA}
    return LlamaConfig(hidden_size=HEAD_DIM * 4, num_attention_heads=4, head_dim=HEAD_DIM,
                       max_position_embeddings=MAX_POS, rope_parameters=rope)


@pytest.mark.parametrize("scaling", SCALINGS[1:], ids=["linear", "llama3"])
def test_inv_freq_matches_hf(scaling: dict) -> None:
    expected, _ = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](hf_config(scaling), "cpu")
    torch.testing.assert_close(compute_inv_freq(HEAD_DIM, THETA, scaling, MAX_POS), expected, atol=0, rtol=0)


def test_llama3_default_original_context_is_max_position_embeddings() -> None:
    scaling = {k: v for k, v in SCALINGS[2].items() if k != "original_max_position_embeddings"}
    with_default = compute_inv_freq(HEAD_DIM, THETA, scaling, 256)
    torch.testing.assert_close(with_default, compute_inv_freq(HEAD_DIM, THETA, SCALINGS[2], 99), atol=0, rtol=0)


@pytest.mark.parametrize("scaling", SCALINGS, ids=["default", "linear", "llama3"])
def test_rotation_matches_hf(scaling: dict | None) -> None:
    gen = torch.Generator().manual_seed(0)
    positions = torch.tensor([0, 1, 2, 7, 100, 1000, 3000, 5])
    q = torch.randn(8, 4 * HEAD_DIM, generator=gen)
    k = torch.randn(8, 2 * HEAD_DIM, generator=gen)
    rope = RotaryEmbedding(HEAD_DIM, THETA, MAX_POS, scaling)
    out_q, out_k = rope(positions, q, k)
    cos, sin = LlamaRotaryEmbedding(hf_config(scaling))(q, positions[None])
    ref_q, ref_k = apply_rotary_pos_emb(q.view(1, 8, 4, HEAD_DIM), k.view(1, 8, 2, HEAD_DIM), cos, sin,
                                        unsqueeze_dim=2)
    torch.testing.assert_close(out_q, ref_q.reshape(8, -1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_k, ref_k.reshape(8, -1), atol=1e-5, rtol=1e-5)


def test_rotation_keeps_dtype_and_inv_freq_stays_float32() -> None:
    rope = RotaryEmbedding(HEAD_DIM, THETA, MAX_POS).to(torch.bfloat16)
    assert rope.inv_freq.dtype == torch.float32
    q = torch.randn(3, 2, HEAD_DIM, dtype=torch.bfloat16)
    out_q, out_k = rope(torch.arange(3), q, q.clone())
    assert out_q.dtype == torch.bfloat16 and out_q.shape == q.shape
    torch.testing.assert_close(out_q[0], q[0])  # position 0 is the identity


def test_unsupported_rope_type_lists_supported() -> None:
    with pytest.raises(ValueError, match=r"'dynamic' is not supported; supported types are "
                                         r"\['default', 'linear', 'llama3'\]"):
        check_rope_scaling({"type": "dynamic", "factor": 2.0})
    with pytest.raises(ValueError, match="rope_scaling.factor is required for rope_type 'linear'"):
        compute_inv_freq(HEAD_DIM, THETA, {"rope_type": "linear"}, MAX_POS)
