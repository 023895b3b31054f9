"""RMSNorm (plain and with the fused residual add), SiluAndMul, embedding and LM head."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from lamina.layers.activation import SiluAndMul
from lamina.layers.embedding import ParallelLMHead, VocabEmbedding
from lamina.layers.norm import RMSNorm


def test_rms_norm_matches_hf_in_fp32_and_bf16() -> None:
    gen = torch.Generator().manual_seed(0)
    weight = 1 + 0.1 * torch.randn(64, generator=gen)
    x = 3 * torch.randn(5, 64, generator=gen)
    ours, ref = RMSNorm(64, eps=1e-5), LlamaRMSNorm(64, eps=1e-5)
    ours.weight.data.copy_(weight)
    ref.weight.data.copy_(weight)
    torch.testing.assert_close(ours(x), ref(x), atol=0, rtol=0)
    ours, ref = ours.to(torch.bfloat16), ref.to(torch.bfloat16)
    torch.testing.assert_close(ours(x.bfloat16()), ref(x.bfloat16()), atol=0, rtol=0)


def test_fused_residual_add_equals_add_then_norm() -> None:
    norm = RMSNorm(16)
    norm.weight.data.normal_()
    x, residual = torch.randn(4, 16), torch.randn(4, 16)
    out, new_residual = norm(x, residual)
    torch.testing.assert_close(new_residual, x + residual)
    torch.testing.assert_close(out, norm(x + residual))


def test_silu_and_mul() -> None:
    gate, up = torch.randn(3, 8), torch.randn(3, 8)
    torch.testing.assert_close(SiluAndMul()(torch.cat([gate, up], -1)), F.silu(gate) * up)


def test_embedding_and_tied_lm_head() -> None:
    emb = VocabEmbedding(10, 4)
    table = torch.randn(10, 4)
    emb.weight.weight_loader(emb.weight, table)
    torch.testing.assert_close(emb(torch.tensor([3, 0, 9])), table[[3, 0, 9]])
    head = ParallelLMHead(10, 4, tied_to=emb)
    assert head.weight is emb.weight
    hidden = torch.randn(2, 4, dtype=torch.float32)
    logits = head.compute_logits(hidden)
    assert logits.dtype == torch.float32 and logits.shape == (2, 10)
    torch.testing.assert_close(logits, hidden @ table.T)
    untied = ParallelLMHead(10, 4)
    assert untied.weight is not emb.weight and untied.weight.weight_loader is not None
