"""Activations of the gated MLP."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lamina.layers.norm import fused_ops_for


class SiluAndMul(nn.Module):
    """x = [gate | up] along the last dim (the fused gate_up output); returns silu(gate) * up.

    CUDA tensors go to one Triton kernel (`fused_ops.silu_and_mul`, same rounding) unless `use_fused`
    is False; CPU tensors to the two PyTorch ops below.
    """

    use_fused: bool = True  # False (on an instance or the class): always the PyTorch path

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ops = fused_ops_for(x) if self.use_fused else None
        if ops is not None:
            return ops.silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
