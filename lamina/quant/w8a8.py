"""W8A8 matmuls: dynamic per-token activation quantization and the int8 / fp8 GEMMs, on any device.

    x [M, K] --per token: s_x = max|x_m| / QMAX--> x_q [M, K] (int8 or fp8 e4m3), s_x [M, 1] float32
    y [M, N] = (x_q @ w_q^T) * s_x * s_w^T (+ bias)          w_q [N, K], s_w [N, 1] float32 (per channel)

int8: the product accumulates exactly in int32 through `torch._int_mm` (CPU and CUDA; on CUDA it needs
M > 16 and K, N multiples of 8: rows are padded with zeros up to 32, other shapes take the exact reference
path). fp8: on CUDA with compute capability >= 8.9 (the H200 is 9.0), `torch._scaled_mm` with row-wise scales
(s_x [M, 1], s_w^T [1, N], bf16 output), or at decode-sized M lamina's own Triton GEMM where the device's
measured table says it is faster (lamina/kernels/fp8_gemm.py); elsewhere the reference path. The reference path
(`int8_reference`, `fp8_reference`) computes the same products in float64 / float32, exact for int8: the GPU
check (scripts/quant_w8a8_gpu_check.py) and the tests compare the fast paths with it.

The activation quantization runs as one Triton kernel on CUDA (lamina/kernels/token_quant.py, picked by
dispatch.token_quant_for); elsewhere, and as its reference, a few torch ops (amax, divide, round, cast).
Nothing here imports triton.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lamina.config import KernelChoice
from lamina.layers import dispatch
from lamina.layers.linear import QuantMethod, set_weight_attrs
from lamina.quant.config import WeightQuantArgs

INT8_MAX = 127.0
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
_MIN_SCALE = 1e-12  # an all-zero token: any scale works, 0 would divide by zero
_INT_MM_MIN_ROWS = 32  # CUDA's _int_mm wants M > 16


def per_token_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (int8 [M, K], scales float32 [M, 1]) with x ~ q * scale, one symmetric scale a row."""
    kernel = dispatch.token_quant_for(x)
    if kernel is not None:
        return kernel.per_token_quant(x, torch.int8, INT8_MAX, _MIN_SCALE)
    return per_token_int8_reference(x)


def per_token_int8_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.float()
    scale = (x.abs().amax(dim=-1, keepdim=True) / INT8_MAX).clamp(min=_MIN_SCALE)
    return torch.round(x / scale).clamp(-128, 127).to(torch.int8), scale


def per_token_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (fp8 e4m3 [M, K], scales float32 [M, 1]): each row's max |x| maps to 448."""
    kernel = dispatch.token_quant_for(x)
    if kernel is not None:
        return kernel.per_token_quant(x, FP8_DTYPE, FP8_MAX, _MIN_SCALE)
    return per_token_fp8_reference(x)


def per_token_fp8_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.float()
    scale = (x.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp(min=_MIN_SCALE)
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def int8_reference(x_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    """x_q [M, K] @ w_q[N, K]^T in int32, exactly (float64 holds every partial sum of int8 products)."""
    return (x_q.double() @ w_q.double().t()).to(torch.int32)


def int8_matmul(x_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    """x_q [M, K] @ w_q[N, K]^T in int32 through torch._int_mm (exact)."""
    rows, k = x_q.shape
    n = w_q.shape[0]
    if x_q.device.type != "cuda":
        return torch._int_mm(x_q, w_q.t())
    if k % 8 or n % 8:
        return int8_reference(x_q, w_q)
    if rows < _INT_MM_MIN_ROWS:
        x_q = F.pad(x_q, (0, 0, 0, _INT_MM_MIN_ROWS - rows))
    return torch._int_mm(x_q, w_q.t())[:rows]


def fp8_reference(x_q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
                  out_dtype: torch.dtype) -> torch.Tensor:
    """(x_q @ w_q^T) * x_scale * w_scale^T in float32, cast to out_dtype."""
    return ((x_q.float() @ w_q.float().t()) * x_scale * w_scale.float().t()).to(out_dtype)


def scaled_mm_supported(x: torch.Tensor, w_q: torch.Tensor) -> bool:
    """Whether torch._scaled_mm runs fp8 row-wise here: CUDA, sm >= 8.9, K and N multiples of 16."""
    if x.device.type != "cuda" or torch.cuda.get_device_capability(x.device) < (8, 9):
        return False
    n, k = w_q.shape
    return k % 16 == 0 and n % 16 == 0


def fp8_matmul(x_q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
               out_dtype: torch.dtype, kernels: KernelChoice = dispatch.DEFAULT_KERNELS) -> torch.Tensor:
    """(x_q @ w_q^T) * x_scale * w_scale^T: lamina's Triton kernel where the device's measured table found it
    faster (decode-sized M: lamina/kernels/fp8_gemm.py; `kernels.gemv` off keeps it out), else torch._scaled_mm
    where supported (row-wise scales, bf16 out; w_q^T is column-major as cuBLASLt wants), the reference path
    elsewhere."""
    kernel = dispatch.fp8_gemm_for(x_q, w_q, kernels)
    if kernel is not None:
        module, config = kernel
        return module.fp8_gemm(x_q, x_scale, w_q, w_scale, out_dtype, config)
    if not scaled_mm_supported(x_q, w_q):
        return fp8_reference(x_q, x_scale, w_q, w_scale, out_dtype)
    return scaled_mm_rowwise(x_q, x_scale, w_q, w_scale).to(out_dtype)


def scaled_mm_rowwise(x_q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor,
                      w_scale: torch.Tensor) -> torch.Tensor:
    """torch._scaled_mm with row-wise scales, bf16 out (`scaled_mm_supported` operands)."""
    return torch._scaled_mm(x_q, w_q.t(), scale_a=x_scale.contiguous(), scale_b=w_scale.float().t().contiguous(),
                            out_dtype=torch.bfloat16)


def flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


class W8A8LinearMethod(QuantMethod):
    """Weights stored one value per element (`weight` int8 or fp8 [rows, in]) with one float32 scale per
    output row (`weight_scale` [rows, 1]); subclasses quantize the input and multiply."""

    weight_dtype = torch.int8

    def __init__(self, args: WeightQuantArgs) -> None:
        self.args = args
        self.output_sizes: list[int] = []

    def create_weights(self, layer: Any, input_size: int, output_sizes: list[int],
                       params_dtype: torch.dtype) -> None:
        if getattr(layer, "tp_size", 1) > 1:
            raise NotImplementedError("tensor_parallel_size > 1 with a quantized checkpoint is not supported yet")
        self.output_sizes = list(output_sizes)
        rows = sum(output_sizes)
        for name, data, attrs in (("weight", torch.zeros(rows, input_size, dtype=self.weight_dtype),
                                   {"input_dim": 1, "output_dim": 0}),
                                  ("weight_scale", torch.ones(rows, 1, dtype=torch.float32), {"output_dim": 0})):
            param = nn.Parameter(data, requires_grad=False)
            set_weight_attrs(param, {**attrs, "weight_loader": layer.weight_loader})
            layer.register_parameter(name, param)

    def dequantized_weight(self, layer: Any) -> torch.Tensor:
        """The weight the layer would have unquantized: w_q * s_w, float32 [rows, in]."""
        return layer.weight.float() * layer.weight_scale

    def matmul(self, layer: Any, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] in the model dtype -> x W^T [M, N] in the model dtype, activations quantized."""
        raise NotImplementedError

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = self.matmul(layer, flat(x))
        if bias is not None:
            out = out + bias
        return out.view(*x.shape[:-1], out.shape[-1])
