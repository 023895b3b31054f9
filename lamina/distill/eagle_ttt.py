"""Training-time test (EAGLE-3): the head unrolled on its own features, with the attention a draft chain sees.

Windows of L positions, base p in [0, L): step 0 feeds (token p + 1, fc(f[p])) at position p; step j >= 1
feeds (token_j[p], y_{j-1}[p]) at position p + j, y_{j-1} the head's own pre-norm output of step j - 1. In the
engine the chain drafted after verified position p attends to the verified keys [0, p] (step 0's) and to its
own draft keys; the unroll gives every base the same view:

    step j, base p attends to:   K0[0 .. p]  (causal, step 0's keys)   +   K1[p], .., Kj[p]  (its own chain)

so step j costs one [L, L] score matrix plus j diagonal scores. With steps = 1 this is plain causal attention
over the window: the reference the paged engine path is tested against (tests/spec/test_eagle.py).
"""
from __future__ import annotations

import torch

from lamina.spec.eagle_head import EagleHead

__all__ = ["unroll"]


def _heads(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B, L, n * d] -> [B, n, L, d]."""
    b, length, width = t.shape
    return t.view(b, length, num_heads, width // num_heads).transpose(1, 2)


def _attend(q: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor, chain: list[tuple[torch.Tensor, torch.Tensor]],
            scale: float) -> torch.Tensor:
    """q [B, n, L, d]; k0, v0 and the chain's (k, v) [B, n, L, d] (kv heads already repeated) -> [B, L, n * d]."""
    length = q.shape[2]
    scores = torch.matmul(q, k0.transpose(-1, -2)) * scale
    future = torch.ones(length, length, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    diag = [(q * k).sum(-1, keepdim=True) * scale for k, _ in chain]
    probs = torch.softmax(torch.cat([scores, *diag], dim=-1).float(), dim=-1).to(q.dtype)
    out = torch.matmul(probs[..., :length], v0)
    for i, (_, v) in enumerate(chain):
        out = out + probs[..., length + i:length + i + 1] * v
    b, n, _, d = out.shape
    return out.transpose(1, 2).reshape(b, length, n * d)


def unroll(head: EagleHead, embed: torch.nn.Module, features: torch.Tensor, tokens: list[torch.Tensor]
           ) -> list[torch.Tensor]:
    """features [B, L, 3H] (the target's, at positions 0 .. L - 1); tokens[j] [B, L]: the token step j feeds at
    each base. Returns each step's normed output [B, L, H] (the LM head's input)."""
    cfg = head.cfg
    b, length = features.shape[:2]
    rep = cfg.num_attention_heads // cfg.num_key_value_heads
    x = head.fc(features)
    positions = torch.arange(length, device=features.device).expand(b, length)
    k0 = v0 = None
    chain: list[tuple[torch.Tensor, torch.Tensor]] = []
    outs = []
    for j, step_tokens in enumerate(tokens):
        q, k, v = head.qkv(embed(step_tokens), x, positions + j)
        q = _heads(q, cfg.num_attention_heads)
        k = _heads(k, cfg.num_key_value_heads).repeat_interleave(rep, dim=1)
        v = _heads(v, cfg.num_key_value_heads).repeat_interleave(rep, dim=1)
        if k0 is None:
            k0, v0 = k, v
        else:
            chain.append((k, v))
        normed, x = head.finish(_attend(q, k0, v0, chain, cfg.head_dim ** -0.5), x)
        outs.append(normed)
    return outs
