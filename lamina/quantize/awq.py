"""AWQ (Lin et al., 2024) on tensors: the activation-aware scale search and the clipping search.

Scale search, for linears W that read an input x whose channels can be rescaled for free (the previous op
absorbs 1/s: an RMSNorm weight, or the rows of the linear that produced x):

    s(α) = mean|x|^α / sqrt(max · min)                 α on a grid of 20 in [0, 1); α = 0 is plain RTN
    L(α) = ‖ x Wᵀ − (x / s) Q(W · s)ᵀ ‖²              Q: group-wise int quantize-dequantize (rtn.py's)
    keep the s of the smallest L over sampled calibration tokens

Clipping search, per output row and group of W (after scaling): shrink the group's range [min, max] by
r = 1, 0.95, ..., 0.55, quantize, and keep the r whose output (x_g · w_g, the group's share of the dot
product) is closest to the float one over sampled tokens. Both grids include the identity, so on the
sampled tokens neither search does worse than RTN.
"""
from __future__ import annotations

import torch

from lamina.quant.config import WeightQuantArgs
from lamina.quant.rtn import int_range, minmax_qparams

SCALE_GRID = 20
CLIP_GRID = 20
CLIP_MAX_SHRINK = 0.5  # ratios down to 1 - 0.5 + 1 / CLIP_GRID
CLIP_TOKENS = 512
ROW_BATCH = 256


def fake_quantize_groups(groups: torch.Tensor, args: WeightQuantArgs, scale_dtype: torch.dtype) -> torch.Tensor:
    """Quantize-dequantize groups [rows, num_groups, group_size] with min-max scales (rtn.py's rounding)."""
    scale, zero_point = minmax_qparams(groups, args, scale_dtype)
    scale = scale.float().unsqueeze(-1)
    zero = 0.0 if zero_point is None else zero_point.float().unsqueeze(-1)
    return (torch.round(groups / scale + zero).clamp(*int_range(args.num_bits)) - zero) * scale


def fake_quantize(weight: torch.Tensor, args: WeightQuantArgs, scale_dtype: torch.dtype) -> torch.Tensor:
    """Quantize-dequantize weight [rows, cols] group-wise; float32."""
    rows, cols = weight.shape
    groups = weight.float().reshape(rows, args.num_groups(cols, "weight"), -1)
    return fake_quantize_groups(groups, args, scale_dtype).reshape(rows, cols)


def scale_candidates(mean_abs: torch.Tensor, grid: int = SCALE_GRID) -> list[torch.Tensor]:
    """s(α) for α = 0, 1/grid, ..., (grid - 1)/grid, each normalised to sqrt(max · min) = 1."""
    out = []
    for i in range(grid):
        s = mean_abs.float().pow(i / grid).clamp(min=1e-4)
        out.append(s / (s.max() * s.min()).sqrt())
    return out


def search_scale(x: torch.Tensor, mean_abs: torch.Tensor, weight: torch.Tensor, args: WeightQuantArgs,
                 scale_dtype: torch.dtype, expand: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
    """The best s (one per entry of `mean_abs`) and its α, for the linear weight [rows, in] reading x [n, in].

    `expand` (index [in] into s) lets several input channels share one scale: under grouped-query attention
    a v_proj output channel feeds the o_proj column of every query head that reads its KV head.
    """
    reference = x @ weight.t()
    best_error, best, best_alpha = float("inf"), torch.ones_like(mean_abs), 0.0
    for i, s in enumerate(scale_candidates(mean_abs)):
        full = s if expand is None else s[expand]
        quantized = fake_quantize(weight * full, args, scale_dtype) / full
        error = float((x @ quantized.t() - reference).pow(2).mean())
        if error < best_error:
            best_error, best, best_alpha = error, s, i / SCALE_GRID
    return best, best_alpha


def _clip_rows(w: torch.Tensor, xg: torch.Tensor, args: WeightQuantArgs, scale_dtype: torch.dtype) -> torch.Tensor:
    """w [rows, groups, size] with each (row, group) clipped by its best ratio; xg [groups, n, size]."""
    reference = torch.bmm(xg, w.permute(1, 2, 0))  # [groups, n, rows]
    lo, hi = w.amin(-1, keepdim=True).clamp(max=0), w.amax(-1, keepdim=True).clamp(min=0)
    best_error = torch.full(w.shape[:2], float("inf"))
    best_ratio = torch.ones(w.shape[:2])
    for i in range(int(CLIP_MAX_SHRINK * CLIP_GRID)):
        ratio = 1.0 - i / CLIP_GRID
        quantized = fake_quantize_groups(torch.clamp(w, lo * ratio, hi * ratio), args, scale_dtype)
        error = (torch.bmm(xg, quantized.permute(1, 2, 0)) - reference).pow(2).mean(1).t()  # [rows, groups]
        better = error < best_error
        best_error[better], best_ratio[better] = error[better], ratio
    ratio = best_ratio.unsqueeze(-1)
    return torch.clamp(w, lo * ratio, hi * ratio)


def search_clip(x: torch.Tensor, weight: torch.Tensor, args: WeightQuantArgs, scale_dtype: torch.dtype,
                tokens: int = CLIP_TOKENS) -> torch.Tensor:
    """weight [rows, in] with every group clipped to its best range for inputs x [n, in] (every
    n / `tokens`-th token is used)."""
    rows, cols = weight.shape
    num_groups = args.num_groups(cols, "weight")
    x = x[::max(1, x.shape[0] // tokens)][:tokens].float()
    xg = x.reshape(x.shape[0], num_groups, -1).transpose(0, 1).contiguous()  # [groups, n, size]
    groups = weight.float().reshape(rows, num_groups, -1)
    parts = [_clip_rows(groups[r:r + ROW_BATCH], xg, args, scale_dtype) for r in range(0, rows, ROW_BATCH)]
    return torch.cat(parts).reshape(rows, cols)
