"""Activations of the gated MLP."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lamina.config import KernelChoice
from lamina.layers.dispatch import DEFAULT_KERNELS, pdl_for, silu_and_mul_ops


class SiluAndMul(nn.Module):
    """x = [gate | up] along the last dim (the fused gate_up output); returns silu(gate) * up.

    Where lamina.layers.dispatch allows (CUDA, triton, the model's KernelChoice.fused_ops), one Triton
    kernel (`fused_ops.silu_and_mul`, same rounding) runs; otherwise the two PyTorch ops below.
    """

    def __init__(self, kernels: KernelChoice = DEFAULT_KERNELS) -> None:
        super().__init__()
        self.kernels = kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ops = silu_and_mul_ops(x, self.kernels)
        if ops is not None:
            return ops.silu_and_mul(x, pdl=pdl_for(x, self.kernels))
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
