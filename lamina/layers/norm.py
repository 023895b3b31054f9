"""RMSNorm, with the residual add fused in (one pass over the hidden state per sub-layer).

Where lamina.layers.dispatch allows it (CUDA, triton installed, the model's KernelChoice.fused_ops), the
norm and the add run as one Triton kernel (`lamina.kernels.fused_ops`); otherwise as the PyTorch ops below.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lamina.config import KernelChoice
from lamina.layers.dispatch import DEFAULT_KERNELS, pdl_for, rms_norm_ops


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, normalised in float32 like HF, scaled in the model dtype.

    `forward(x)` returns the normalised x. `forward(x, residual)` first adds x to the residual
    stream and returns (norm(x + residual), x + residual): the decoder's pre-norm pattern.
    Where dispatch allows, one fused Triton kernel (same rounding steps) runs instead.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, kernels: KernelChoice = DEFAULT_KERNELS) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.variance_epsilon = eps
        self.kernels = kernels

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.variance_epsilon)
        return self.weight * (normed if x.dtype == torch.float32 else normed.to(x.dtype))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        ops = rms_norm_ops(x, self.weight, residual, self.kernels)
        if ops is not None:
            pdl = pdl_for(x, self.kernels)
            if residual is None:
                return ops.rms_norm(x, self.weight, self.variance_epsilon, pdl=pdl)
            return ops.fused_add_rms_norm(x, residual, self.weight, self.variance_epsilon, pdl=pdl)
        if residual is None:
            return self._norm(x)
        residual = x + residual
        return self._norm(residual), residual

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.variance_epsilon}"
