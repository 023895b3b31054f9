"""Round-to-nearest (RTN) quantization of one weight matrix with min-max scales: no calibration data.

    symmetric:   scale = max|w| / (2^(b-1) - 1)                 q = clamp(round(w / scale))
    asymmetric:  lo, hi = min(w, 0), max(w, 0)                  (0 stays exactly representable)
                 scale = (hi - lo) / (2^b - 1)
                 zero_point = clamp(round(-2^(b-1) - lo / scale))
                 q = clamp(round(w / scale + zero_point))       w ~ (q - zero_point) * scale

per output row ("channel") or per `group_size` columns of a row ("group"); q in [-2^(b-1), 2^(b-1) - 1].
The scale is rounded to its storage dtype first and q computed from the stored value, so the checkpoint
dequantizes to exactly the weight this function measured.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lamina.quant.config import WeightQuantArgs


@dataclass(frozen=True)
class QuantizedWeight:
    q: torch.Tensor  # int8 [rows, cols]
    scale: torch.Tensor  # [rows, groups], the storage dtype
    zero_point: torch.Tensor | None  # int8 [rows, groups]; None when symmetric

    def dequantize(self) -> torch.Tensor:
        """float32 [rows, cols]: (q - zero_point) * scale."""
        from lamina.quant.wna16 import dequantize

        return dequantize(self.q, self.scale.float(), self.zero_point)


def int_range(num_bits: int) -> tuple[int, int]:
    return -(1 << (num_bits - 1)), (1 << (num_bits - 1)) - 1


def minmax_qparams(groups: torch.Tensor, args: WeightQuantArgs, scale_dtype: torch.dtype
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scales [rows, groups] (in scale_dtype) and zero points (int8, or None) of groups [rows, groups, size]."""
    qmin, qmax = int_range(args.num_bits)
    if args.symmetric:
        scale = groups.abs().amax(dim=-1) / qmax
    else:
        lo = groups.amin(dim=-1).clamp(max=0.0)
        hi = groups.amax(dim=-1).clamp(min=0.0)
        scale = (hi - lo) / (qmax - qmin)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale)).to(scale_dtype)  # all-zero group: any scale
    if args.symmetric:
        return scale, None
    zero_point = torch.round(qmin - lo / scale.float()).clamp(qmin, qmax)
    return scale, zero_point.to(torch.int8)


def rtn_quantize(weight: torch.Tensor, args: WeightQuantArgs, scale_dtype: torch.dtype) -> QuantizedWeight:
    """Quantize weight [rows, cols] with `args` (ValueError when cols is not a multiple of the group size)."""
    rows, cols = weight.shape
    num_groups = args.num_groups(cols, "weight")
    groups = weight.float().reshape(rows, num_groups, cols // num_groups)
    scale, zero_point = minmax_qparams(groups, args, scale_dtype)
    scaled = groups / scale.float().unsqueeze(-1)
    if zero_point is not None:
        scaled = scaled + zero_point.float().unsqueeze(-1)
    q = torch.round(scaled).clamp(*int_range(args.num_bits)).to(torch.int8).reshape(rows, cols)
    return QuantizedWeight(q, scale, zero_point)
