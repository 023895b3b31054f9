"""GPTQ (Frantar et al., 2023) for one weight matrix: quantize the columns one at a time and spread each
column's rounding error over the columns not yet quantized, weighted by the inverse Hessian of the layer's
reconstruction error ‖WX − ŴX‖² (H = 2 X Xᵀ over the calibration tokens).

    H += percdamp * mean(diag H) * I                 dampening (1 %)
    U  = cholesky(H⁻¹)ᵀ  (upper)                     the rows of U are what the column updates need
    for each block of B = 128 columns [i1, i2):      lazy batch updates:
        for column j in the block:
            q_j   = quantize(w_j)                    with its group's scale / zero point (below)
            e_j   = (w_j − q_j) / U[j, j]
            W[:, j:i2] −= e_j U[j, j:i2]             inside the block at once
        W[:, i2:] −= E_block U[i1:i2, i2:]           the rest of the matrix once per block

Group scales and zero points (min-max over the group, as in rtn.py, the scale rounded to its storage dtype)
are computed from the updated weights when the first column of a group is reached. With `act_order` the
columns are visited by decreasing diag(H) and the groups' scales are fixed up front from the original
weights, by column index: the checkpoint keeps its plain group layout (compressed-tensors `actorder`
"static", no g_idx at run time).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from lamina.quant.config import WeightQuantArgs
from lamina.quant.rtn import QuantizedWeight, int_range, minmax_qparams

BLOCK_SIZE = 128
PERCDAMP = 0.01
_DAMP_RETRIES = 3  # each retry dampens 10x more


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """The column loop is thousands of small ops: with two intra-op threads it ran 20-100x slower than with one
    on a busy 2-core machine (threads spinning between ops), so it runs on one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _block_size(group_size: int) -> int:
    """A multiple of the group size near BLOCK_SIZE, so that no group straddles two blocks."""
    return group_size * max(1, BLOCK_SIZE // group_size)


def inverse_hessian_factor(hessian: torch.Tensor, percdamp: float = PERCDAMP, what: str = "layer") -> torch.Tensor:
    """Upper Cholesky factor of (H + damp I)⁻¹, float32; ValueError when H stays singular despite dampening."""
    h = hessian.double()
    diag = torch.arange(h.shape[0])
    damp = percdamp * h.diag().mean().clamp(min=1e-8)
    for attempt in range(_DAMP_RETRIES):
        damped = h.clone()
        damped[diag, diag] += damp * 10 ** attempt
        lower, info = torch.linalg.cholesky_ex(damped)
        if int(info) == 0:
            return torch.linalg.cholesky(torch.cholesky_inverse(lower), upper=True).float()
    raise ValueError(f"{what}: the calibration Hessian is not positive definite even with {100 * percdamp:g} % x "
                     f"{10 ** (_DAMP_RETRIES - 1)} dampening; calibrate on more tokens (--num-samples, --calib)")


def _group_qparams(columns: torch.Tensor, args: WeightQuantArgs, scale_dtype: torch.dtype
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale (storage dtype) and zero point (float; 0 when symmetric) of columns [rows, group_size]."""
    scale, zero_point = minmax_qparams(columns.unsqueeze(1), args, scale_dtype)
    zero = torch.zeros_like(scale, dtype=torch.float32) if zero_point is None else zero_point.float()
    return scale[:, 0], zero[:, 0]


class _Groups:
    """Every group's scale and zero point, filled as GPTQ reaches the groups (or all up front)."""

    def __init__(self, weight: torch.Tensor, args: WeightQuantArgs, scale_dtype: torch.dtype) -> None:
        rows, cols = weight.shape
        self.args, self.scale_dtype = args, scale_dtype
        self.size = cols // args.num_groups(cols, "weight")
        self.scale = torch.ones(rows, cols // self.size, dtype=scale_dtype)
        self.zero = torch.zeros(rows, cols // self.size)

    def fill(self, group: int, columns: torch.Tensor) -> None:
        self.scale[:, group], self.zero[:, group] = _group_qparams(columns, self.args, self.scale_dtype)

    def quantize(self, column: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(integers, dequantized values) of one column with its group's parameters."""
        scale, zero = self.scale[:, group].float(), self.zero[:, group]
        q = torch.round(column / scale + zero).clamp(*int_range(self.args.num_bits))
        return q, (q - zero) * scale

    def quantized_weight(self, q: torch.Tensor) -> QuantizedWeight:
        zero_point = None if self.args.symmetric else self.zero.to(torch.int8)
        return QuantizedWeight(q.to(torch.int8), self.scale, zero_point)


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, args: WeightQuantArgs, scale_dtype: torch.dtype,
                  act_order: bool = False, percdamp: float = PERCDAMP, what: str = "layer") -> QuantizedWeight:
    """Quantize weight [rows, cols] given the Hessian [cols, cols] of its inputs (module docstring)."""
    with _one_thread():
        return _gptq(weight, hessian, args, scale_dtype, act_order, percdamp, what)


def _gptq(weight: torch.Tensor, hessian: torch.Tensor, args: WeightQuantArgs, scale_dtype: torch.dtype,
          act_order: bool, percdamp: float, what: str) -> QuantizedWeight:
    w = weight.detach().float().clone()
    h = hessian.detach().float().clone()
    dead = h.diag() == 0  # inputs that are always zero: their weights do not matter
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    groups = _Groups(w, args, scale_dtype)
    cols = w.shape[1]
    perm = torch.argsort(h.diag(), descending=True) if act_order else torch.arange(cols)
    if act_order:
        for g in range(cols // groups.size):
            groups.fill(g, w[:, g * groups.size:(g + 1) * groups.size])
    w, u = w[:, perm], inverse_hessian_factor(h[perm][:, perm], percdamp, what)
    q = torch.zeros_like(w)
    block = _block_size(groups.size)
    for i1 in range(0, cols, block):
        i2 = min(i1 + block, cols)
        errors = _quantize_block(w[:, i1:i2], u[i1:i2, i1:i2], q[:, i1:i2], perm[i1:i2], groups, act_order)
        w[:, i2:] -= errors @ u[i1:i2, i2:]
    return groups.quantized_weight(q[:, torch.argsort(perm)])


def _quantize_block(w: torch.Tensor, u: torch.Tensor, q: torch.Tensor, columns: torch.Tensor, groups: _Groups,
                    act_order: bool) -> torch.Tensor:
    """Quantize the block's columns in place (w updated, q filled); returns the scaled errors [rows, block]."""
    errors = torch.zeros_like(w)
    for i in range(w.shape[1]):
        group = int(columns[i]) // groups.size
        if not act_order and int(columns[i]) % groups.size == 0:  # a group starts: all its columns are here
            groups.fill(group, w[:, i:i + groups.size])
        q[:, i], dequantized = groups.quantize(w[:, i], group)
        error = (w[:, i] - dequantized) / u[i, i]
        w[:, i:] -= error[:, None] * u[i, i:][None, :]
        errors[:, i] = error
    return errors
