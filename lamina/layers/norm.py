"""RMSNorm, with the residual add fused in (one pass over the hidden state per sub-layer).

On CUDA (with triton installed) the norm and the add run as one Triton kernel
(`lamina.kernels.fused_ops`); on CPU, or with `use_fused = False`, as the PyTorch ops below.
`fused_ops_for` is that switch, shared by the rotary and activation layers.
"""
from __future__ import annotations

import functools
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_FUSED_HIDDEN = 32768  # one program holds a whole row in registers


@functools.cache
def _load_fused_ops() -> ModuleType | None:
    try:
        from lamina.kernels import fused_ops
    except ImportError:  # no triton: the PyTorch path everywhere
        return None
    return fused_ops


def fused_ops_for(x: torch.Tensor) -> ModuleType | None:
    """The fused-kernel module when x is a CUDA tensor and triton imports (tried once), else None."""
    return _load_fused_ops() if x.is_cuda and x.dtype in FUSED_DTYPES else None


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, normalised in float32 like HF, scaled in the model dtype.

    `forward(x)` returns the normalised x. `forward(x, residual)` first adds x to the residual
    stream and returns (norm(x + residual), x + residual): the decoder's pre-norm pattern.
    CUDA tensors go to one fused Triton kernel (same rounding steps) unless `use_fused` is False.
    """

    use_fused: bool = True  # False (on an instance or the class): always the PyTorch path

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.variance_epsilon = eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.variance_epsilon)
        return self.weight * (normed if x.dtype == torch.float32 else normed.to(x.dtype))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        ops = self._fused_ops(x, residual)
        if ops is not None:
            if residual is None:
                return ops.rms_norm(x, self.weight, self.variance_epsilon)
            return ops.fused_add_rms_norm(x, residual, self.weight, self.variance_epsilon)
        if residual is None:
            return self._norm(x)
        residual = x + residual
        return self._norm(residual), residual

    def _fused_ops(self, x: torch.Tensor, residual: torch.Tensor | None) -> ModuleType | None:
        if not self.use_fused or self.weight.dtype != x.dtype or x.shape[-1] > MAX_FUSED_HIDDEN:
            return None
        if residual is not None and (residual.dtype != x.dtype or residual.shape != x.shape):
            return None
        return fused_ops_for(x)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.variance_epsilon}"
