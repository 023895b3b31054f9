"""W4A16 / W8A16 weight-only integer linear layers (int8 and rtn4 checkpoints, and any compressed-tensors
pack-quantized or naive-quantized weight-only scheme): w = (q - zero_point) * scale, per channel or group.

Parameters of one layer (rows = the sum of its fused output sizes, groups = in / group_size or 1):

    weight_packed      int32 [rows, ceil(in * b / 32)]   pack-quantized: the checkpoint's words as stored
    weight             int8  [rows, in]                  naive-quantized instead of weight_packed
    weight_scale       dtype [rows, groups]              the model dtype
    weight_zero_point  int8  [rows, groups]              asymmetric only; unpacked when loaded (the checkpoint
                                                         packs it along rows, across fused shards' borders)
    weight_shape       int64 [shards, 2]                 each shard's (out, in), checked against the layer

`apply` runs the Triton kernels that `kernel_for` picks on CUDA (lamina/kernels/wna16_tc.py for 2..16 bf16 rows
at 4 bits, 4..16 at 8, and the int4 LM head's one; wna16_row.py for other bf16 rows up to 4, wna16_gemv.py for one
fp16 row, wna16_mma.py for up to 16, wna16_gemm.wna16_matmul for more: they read these same parameters, the
checkpoint's layout, so nothing is repacked after loading), else the reference path: dequantize the whole weight
and multiply (exact, any device, not fast; the kernels' oracle).
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lamina.layers import dispatch
from lamina.layers.linear import QuantMethod, copy_checked, set_weight_attrs
from lamina.quant.config import WeightQuantArgs
from lamina.quant.packing import packed_size, unpack_int32

_QKV_INDEX = {"q": 0, "k": 1, "v": 2}
Kernel = Callable[[nn.Module, torch.Tensor, torch.Tensor | None], torch.Tensor]


def kernel_for(x: torch.Tensor, layer: nn.Module, args: WeightQuantArgs) -> Kernel | None:
    """The fast W4A16 / W8A16 path (issue #13): on CUDA (dispatch.on_kernel_device), for fp16 / bf16 x with
    scales of x's dtype and triton importable. When the layer's KernelChoice allows decode-sized kernels:
    up to 16 bf16 rows as `_takes_tc` says (int4 2..16 and the LM head's one, int8 4..16): lamina.kernels.wna16_tc
    (the tensor-core GEMV) where it takes the operands (K and groups whole 16-word chunks: 128 values at 4 bits,
    64 at 8, or per channel); else 1..GEMV_ROWS rows lamina.kernels.wna16_row where it takes them (bf16 x; K whole
    words, groups of whole 4-word chunks: 32 values at 4 bits, 16 at 8, or per channel); else one row
    lamina.kernels.wna16_gemv, 2..16 rows wna16_mma (where K and the group size are multiples of 16; else the
    GEMV up to its MAX_M); lamina.kernels.wna16_gemm.wna16_matmul for the rest. None runs the reference path
    (GEMV_ROWS' and TC_ONE_ROW_MIN_N's comments have the measurements that chose the kernels).
    Pack-quantized 4- and 8-bit weights, and naive int8 ones whose rows are whole int32 words. Triton is
    imported on the first CUDA call only, never on CPU."""
    if not (dispatch.on_kernel_device(x) and x.dtype in dispatch.GEMV_DTYPES) or getattr(args, "type", "int") != "int":
        return None
    if layer.weight_scale.dtype != x.dtype or x.shape[-1] == 0:
        return None
    if args.layout == "pack-quantized":
        words, xor = layer.weight_packed, 0
    elif args.num_bits == 8 and x.shape[-1] % 4 == 0 and layer.weight.is_contiguous():
        words, xor = None, _NAIVE_INT8_XOR
    else:
        return None
    per_word = 32 // args.num_bits
    group_size = args.group_size if args.strategy == "group" else None
    if group_size is not None and group_size % per_word:
        return None
    kernels = _wna16_kernels()
    if kernels is None:
        return None
    choice = getattr(layer, "kernels", dispatch.DEFAULT_KERNELS)
    w = words if words is not None else layer.weight.view(torch.int32)
    fn = _kernel(kernels, x.numel() // x.shape[-1], w.shape[0], x.shape[-1], args.num_bits, group_size, x.dtype,
                 choice.gemv, dispatch.pdl_for(x, choice))

    def run(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        zero = getattr(layer, "weight_zero_point", None)
        out = fn(x2, w, layer.weight_scale, zero, bias, args.num_bits, group_size, xor)
        return out.view(*x.shape[:-1], out.shape[-1])
    return run


_NAIVE_INT8_XOR = -0x7F7F7F80  # lamina.kernels.wna16_gemv.NAIVE_INT8_XOR, without importing triton
# Rows up to which wna16_row runs rather than wna16_mma: it unpacks each word once for up to 4 rows. On the H200's
# Llama-3-8B shapes its GEMVs took less time than wna16_gemv's at one row, and a whole decode step less than with
# wna16_mma at 2 and 4 rows (docs/kernels.md, "W4A16 / W8A16 GEMV of 1-4 rows").
GEMV_ROWS = 4
# The tensor-core GEMV lamina.kernels.wna16_tc, where it takes the operands (up to 16 rows): its time hardly grows
# with the rows of x (up to 8; a second MMA chain for 9..16), where wna16_row's does. int4: from 2 rows on, and at
# one row for weights of at least TC_ONE_ROW_MIN_N rows (the LM head, where wna16_row is issue-bound); int8: from
# TC_INT8_MIN_ROWS rows on. The crossovers and the decode steps they were read from: docs/kernels.md, "W4A16 /
# W8A16 GEMV on the tensor cores".
TC_ONE_ROW_MIN_N = 65536
TC_INT8_MIN_ROWS = 4


def _takes_tc(tc: ModuleType, rows: int, n: int, k: int, num_bits: int, group_size: int | None,
              dtype: torch.dtype) -> bool:
    """Whether kernel_for picks lamina.kernels.wna16_tc (the comment above)."""
    wanted = rows > 1 or n >= TC_ONE_ROW_MIN_N if num_bits == 4 else rows >= TC_INT8_MIN_ROWS
    return wanted and tc.takes(dtype, rows, k, num_bits, group_size)


def _kernel(kernels: tuple[ModuleType, ...], rows: int, n: int, k: int, num_bits: int, group_size: int | None,
            dtype: torch.dtype, small: bool, pdl: bool) -> Callable[..., torch.Tensor]:
    """The kernel function for `rows` rows of x of `dtype` and a weight of n rows (kernel_for's docstring); small:
    decode-sized kernels allowed; pdl: the decode kernels launch with programmatic dependent launch
    (lamina.kernels.pdl)."""
    gemv, mma, gemm, row, tc = kernels
    if small and _takes_tc(tc, rows, n, k, num_bits, group_size, dtype):
        return functools.partial(tc.wna16_tc_gemv, pdl=pdl)
    if small and rows <= GEMV_ROWS and row.takes(dtype, rows, k, num_bits, group_size):
        return functools.partial(row.wna16_row_gemv, pdl=pdl)
    if small and 1 < rows <= mma.MAX_M and mma.takes(k, group_size):
        return mma.wna16_mma
    if small and rows <= gemv.MAX_M:
        return gemv.wna16_gemv
    return gemm.wna16_matmul


def decode_kernel(rows: int, n: int, k: int, num_bits: int, group_size: int | None,
                  dtype: torch.dtype) -> Callable[..., torch.Tensor]:
    """The kernel function kernel_for runs for `rows` rows of x (decode-sized kernels allowed, no PDL), for
    benchmarks; imports triton."""
    kernels = _wna16_kernels()
    assert kernels is not None, "the W4A16 / W8A16 kernels need triton"
    return _kernel(kernels, rows, n, k, num_bits, group_size, dtype, small=True, pdl=False)


@functools.cache
def _wna16_kernels() -> tuple[ModuleType, ...] | None:
    """(wna16_gemv, wna16_mma, wna16_gemm, wna16_row, wna16_tc), imported on the first call (they import
    triton)."""
    try:
        from lamina.kernels import wna16_gemm, wna16_gemv, wna16_mma, wna16_row, wna16_tc
    except ImportError:  # no triton: the reference path
        return None
    return wna16_gemv, wna16_mma, wna16_gemm, wna16_row, wna16_tc


def dequantize(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None) -> torch.Tensor:
    """(q - zero_point) * scale in the scale's dtype; q [rows, in], scale / zero_point [rows, groups]."""
    rows, cols = q.shape
    groups = scale.shape[1]
    w = q.to(scale.dtype).view(rows, groups, cols // groups)
    if zero_point is not None:
        w = w - zero_point.to(scale.dtype).unsqueeze(-1)
    return (w * scale.unsqueeze(-1)).view(rows, cols)


class WNA16LinearMethod(QuantMethod):
    """Integer weights (4 or 8 bits) with per-channel or per-group scales; activations in the model dtype."""

    def __init__(self, args: WeightQuantArgs) -> None:
        self.args = args
        self.input_size = 0
        self.output_sizes: list[int] = []

    def create_weights(self, layer: Any, input_size: int, output_sizes: list[int],
                       params_dtype: torch.dtype) -> None:
        if getattr(layer, "tp_size", 1) > 1:
            raise NotImplementedError("tensor_parallel_size > 1 with a quantized checkpoint is not supported yet")
        self.input_size, self.output_sizes = input_size, list(output_sizes)
        rows, args = sum(output_sizes), self.args
        groups = args.num_groups(input_size, type(layer).__name__)
        group_dim = {"input_dim": 1} if args.strategy == "group" else {}
        if args.layout == "pack-quantized":
            self._add(layer, "weight_packed", torch.zeros(rows, packed_size(input_size, args.num_bits),
                                                          dtype=torch.int32),
                      {"input_dim": 1, "output_dim": 0, "packed_dim": 1, "pack_factor": 32 // args.num_bits})
            self._add(layer, "weight_shape", torch.zeros(len(output_sizes), 2, dtype=torch.int64), {},
                      loader=self._shape_loader)
        else:
            self._add(layer, "weight", torch.zeros(rows, input_size, dtype=torch.int8),
                      {"input_dim": 1, "output_dim": 0})
        self._add(layer, "weight_scale", torch.empty(rows, groups, dtype=params_dtype), {"output_dim": 0, **group_dim})
        if not args.symmetric:
            loader = self._packed_zero_point_loader(layer) if args.layout == "pack-quantized" else None
            self._add(layer, "weight_zero_point", torch.zeros(rows, groups, dtype=torch.int8),
                      {"output_dim": 0, **group_dim}, loader=loader)

    @staticmethod
    def _add(layer: Any, name: str, data: torch.Tensor, attrs: dict[str, Any], loader: Any = None) -> None:
        param = nn.Parameter(data, requires_grad=False)
        set_weight_attrs(param, {**attrs, "weight_loader": loader or layer.weight_loader})
        layer.register_parameter(name, param)

    def _shard(self, shard_id: Any) -> int:
        index = _QKV_INDEX.get(shard_id, shard_id) if shard_id is not None else 0
        if not isinstance(index, int) or not 0 <= index < len(self.output_sizes):
            raise ValueError(f"shard_id {shard_id!r} does not name one of {len(self.output_sizes)} shard(s)")
        return index

    def _shape_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
        """Check the checkpoint's weight_shape against this shard's (out, in), and keep it."""
        index = self._shard(shard_id)
        expected = (self.output_sizes[index], self.input_size)
        if tuple(int(v) for v in loaded.flatten()) != expected:
            raise ValueError(f"weight_shape: the checkpoint's {loaded.tolist()} is not the layer's {list(expected)}")
        copy_checked(param[index], loaded.to(torch.int64).flatten(), "weight_shape")

    def _packed_zero_point_loader(self, layer: Any) -> Callable[..., None]:
        def load(param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
            rows = self.output_sizes[self._shard(shard_id)]
            unpacked = unpack_int32(loaded, self.args.num_bits, rows, dim=0)
            if shard_id is None:
                layer.weight_loader(param, unpacked)
            else:
                layer.weight_loader(param, unpacked, shard_id)
        return load

    def integer_weight(self, layer: Any) -> torch.Tensor:
        """q [rows, in] as int8."""
        if self.args.layout == "pack-quantized":
            return unpack_int32(layer.weight_packed, self.args.num_bits, self.input_size, dim=1)
        return layer.weight

    def dequantized_weight(self, layer: Any) -> torch.Tensor:
        """The weight this layer computes with, [rows, in] in the model dtype."""
        return dequantize(self.integer_weight(layer), layer.weight_scale, getattr(layer, "weight_zero_point", None))

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        kernel = kernel_for(x, layer, self.args)
        if kernel is not None:
            return kernel(layer, x, bias)
        return F.linear(x, self.dequantized_weight(layer).to(x.dtype), bias)
