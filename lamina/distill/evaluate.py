"""Held-out perplexity and the greedy draft/teacher agreement that speculative decoding relies on."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .data import eval_windows


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    device = ids.device
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        return model(input_ids=ids, use_cache=False).logits.float()


def perplexity(
    model: torch.nn.Module, tokens: np.ndarray, seq_len: int, batch_size: int = 16,
    max_tokens: int | None = None,
) -> dict[str, float]:
    """``exp(mean NLL)`` over consecutive windows of ``tokens`` (each token after the first predicted once).

    Returns ``{"perplexity", "nll", "tokens"}``.
    """
    device = next(model.parameters()).device
    windows = eval_windows(tokens, seq_len, max_tokens)
    total, count = 0.0, 0
    model.eval()
    for batch in windows.split(batch_size):
        batch = batch.to(device)
        logits = _logits(model, batch[:, :-1])
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum")
        total += nll.item()
        count += batch[:, 1:].numel()
    mean = total / count
    return {"perplexity": float(np.exp(mean)), "nll": mean, "tokens": count}


@dataclass(frozen=True)
class Agreement:
    """Greedy speculation statistics of a draft against its target, ``k`` tokens looked ahead.

    ``accepted_hist[j]`` is the fraction of positions where exactly ``j`` leading draft tokens equal the
    target's greedy tokens. ``mean_accepted`` is in ``[0, k]``; ``acceptance_rate = mean_accepted / k``;
    ``tokens_per_step = mean_accepted + 1`` (the target adds one token of its own at every verification);
    ``top1_agreement`` is the fraction where the first draft token matches.
    """

    k: int
    positions: int
    mean_accepted: float
    acceptance_rate: float
    tokens_per_step: float
    top1_agreement: float
    accepted_hist: list[float]

    def to_dict(self) -> dict:
        return asdict(self)


def _greedy_draft(draft: torch.nn.Module, ctx: torch.Tensor, k: int) -> torch.Tensor:
    """k greedy tokens from ``draft`` after each row of ``ctx`` (recomputed, no KV cache: a test tool)."""
    seq = ctx
    for _ in range(k):
        nxt = _logits(draft, seq)[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    return seq[:, ctx.shape[1]:]


def greedy_agreement(
    draft: torch.nn.Module, target: torch.nn.Module, tokens: np.ndarray, k: int = 4,
    positions: int = 1024, context_len: int = 128, batch_size: int = 64, seed: int = 0,
) -> Agreement:
    """Run greedy speculation at ``positions`` random points of ``tokens``.

    At each point the context is the ``context_len`` preceding tokens; the draft proposes ``k`` tokens
    greedily, the target scores context + proposals in one pass, and the accepted count is the length of
    the longest prefix where proposal ``i`` equals the target's argmax after ``context + proposals[:i]``.
    """
    if len(tokens) < context_len + 1:
        raise ValueError(f"agreement: need more than context_len = {context_len} tokens, got {len(tokens)}")
    device = next(target.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(tokens) - context_len, (positions,), generator=gen)
    stream = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
    counts = []
    for chunk in starts.split(batch_size):
        ctx = stream[chunk[:, None] + torch.arange(context_len)].to(device)
        proposals = _greedy_draft(draft, ctx, k)
        verify = _logits(target, torch.cat([ctx, proposals], dim=1))[:, context_len - 1: -1].argmax(-1)
        match = (verify == proposals).long()
        counts.append(match.cumprod(dim=1).sum(dim=1).cpu())
    accepted = torch.cat(counts).float()
    hist = [float((accepted == j).float().mean()) for j in range(k + 1)]
    first = float((accepted >= 1).float().mean())
    mean = float(accepted.mean())
    return Agreement(k, positions, mean, mean / k, mean + 1.0, first, hist)
