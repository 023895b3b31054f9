"""Distillation losses over next-token logits."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def kl_to_teacher(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean over tokens of ``T^2 * KL(softmax(t / T) || softmax(s / T))`` (forward KL, in nats).

    Logits are ``[..., vocab]``; the student's may have a padded vocabulary only if both match, so the
    shapes must be equal. The ``T^2`` factor keeps gradient magnitudes comparable across temperatures.
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student logits {tuple(student_logits.shape)} and teacher logits "
                         f"{tuple(teacher_logits.shape)} must have the same shape (same vocabulary)")
    vocab = student_logits.shape[-1]
    log_s = F.log_softmax(student_logits.float().view(-1, vocab) / temperature, dim=-1)
    log_t = F.log_softmax(teacher_logits.float().view(-1, vocab) / temperature, dim=-1)
    kl = F.kl_div(log_s, log_t, reduction="batchmean", log_target=True)
    return kl * temperature * temperature


def next_token_ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits [..., vocab]`` against ``targets [...]``."""
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def distill_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor | None, targets: torch.Tensor,
    kl_weight: float, ce_weight: float, temperature: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return (total, kl, ce). ``kl`` is 0 when ``teacher_logits`` is None; ``ce`` is always measured."""
    ce = next_token_ce(student_logits, targets)
    if teacher_logits is None:
        kl = torch.zeros((), device=student_logits.device)
    else:
        kl = kl_to_teacher(student_logits, teacher_logits, temperature)
    return kl_weight * kl + ce_weight * ce, kl, ce
