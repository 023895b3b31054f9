"""Kernel dispatch: the one place that decides whether a layer runs a Triton kernel or its PyTorch ops.

    a kernel runs  <=>  the model's KernelChoice allows it             (fixed when the model is built)
                   and  the tensor is on CUDA, in a dtype it takes       (FUSED_DTYPES / GEMV_DTYPES)
                   and  the op's own preconditions hold                  (matching dtypes and shapes, sizes)
                   and  triton imports                                   (tried once, by the first CUDA call)

Each `*_ops` / `*_for` function returns the kernel module to call, or None: the layer then runs its PyTorch
(or cuBLAS) path, which is also the reference the kernels are tested against. Nothing here imports triton
until a CUDA tensor asks, so the CPU path never does.
"""
from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import TYPE_CHECKING

import torch

from lamina.config import KernelChoice
from lamina.layers.cpu_matmul import weight_major_is_faster
from lamina.layers.gemv_rows import gemv_is_faster

if TYPE_CHECKING:
    from lamina.kernels.fp8_gemm import Fp8GemmConfig
    from lamina.layers.norm import RMSNorm

FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_FUSED_HIDDEN = 32768  # a fused-norm program holds a whole row in registers
GEMV_DTYPES = (torch.float16, torch.bfloat16)
DEFAULT_KERNELS = KernelChoice()  # every kernel allowed: what a layer built without a choice gets


@functools.cache
def kernel_module(name: str) -> ModuleType | None:
    """lamina.kernels.<name>, imported by the first call that asks (it imports triton); None where triton does not
    import: the layer then keeps its PyTorch / cuBLAS path. The `_*_module` functions below name the ones used
    (tests replace them); the sampler loads its kernels here too."""
    try:
        return importlib.import_module(f"lamina.kernels.{name}")
    except ImportError:
        return None


def _fused_ops_module() -> ModuleType | None:
    return kernel_module("fused_ops")


def _gemv_module() -> ModuleType | None:
    return kernel_module("gemv")


def on_kernel_device(x: torch.Tensor) -> bool:
    """Whether x lives where the Triton kernels run (CUDA). Tests replace it to run the interpreted kernels
    on CPU tensors, so that every other condition below is exercised as it is on a GPU."""
    return x.is_cuda


def _pdl_module() -> ModuleType | None:
    return kernel_module("pdl")


def pdl_for(x: torch.Tensor, kernels: KernelChoice) -> bool:
    """Whether the kernels a layer runs on x launch with programmatic dependent launch (lamina.kernels.pdl):
    `kernels.pdl` and x on a CUDA device of compute capability 9.0 or later (never under the interpreter)."""
    if not (kernels.pdl and x.is_cuda):
        return False
    module = _pdl_module()
    return module is not None and module.supported(x)


def fused_ops_for(x: torch.Tensor, kernels: KernelChoice) -> ModuleType | None:
    """lamina.kernels.fused_ops when `kernels.fused_ops`, x is a CUDA tensor of a FUSED_DTYPES dtype and
    triton imports; else None."""
    if not (kernels.fused_ops and on_kernel_device(x) and x.dtype in FUSED_DTYPES):
        return None
    return _fused_ops_module()


def rms_norm_ops(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None,
                 kernels: KernelChoice) -> ModuleType | None:
    """RMSNorm (+ residual add): the weight in x's dtype, rows of at most MAX_FUSED_HIDDEN, and the
    residual, if any, of x's dtype and shape."""
    if weight.dtype != x.dtype or x.shape[-1] > MAX_FUSED_HIDDEN:
        return None
    if residual is not None and (residual.dtype != x.dtype or residual.shape != x.shape):
        return None
    return fused_ops_for(x, kernels)


def rotary_ops(q: torch.Tensor, k: torch.Tensor, kernels: KernelChoice) -> ModuleType | None:
    """RoPE on q and k in place: q and k of one dtype."""
    return fused_ops_for(q, kernels) if q.dtype == k.dtype else None


def silu_and_mul_ops(x: torch.Tensor, kernels: KernelChoice) -> ModuleType | None:
    """silu(gate) * up over x = [gate | up]."""
    return fused_ops_for(x, kernels)


def qk_norm_rotary_ops(q: torch.Tensor, q_norm: RMSNorm, k_norm: RMSNorm,
                       kernels: KernelChoice) -> ModuleType | None:
    """Per-head q/k RMSNorm then RoPE in one kernel (Qwen3): one eps for both norms, both weights in
    q's dtype."""
    usable = (q_norm.variance_epsilon == k_norm.variance_epsilon
              and q_norm.weight.dtype == k_norm.weight.dtype == q.dtype)
    return fused_ops_for(q, kernels) if usable else None


# Rows up to which the GEMV runs instead of cuBLAS: at 2-4 rows (a verify step of k <= 3 drafts, batch 2-4
# decodes) cuBLAS beat it on every Llama-3-8B shape on the H200 (docs/notes/2026-12-01-h200-gemv-rows.txt); at 1 row
# the GEMV wins on qkv and gate_up.
GEMV_MAX_ROWS = 1
# ... except where the GEMV was measured faster at more rows of that weight's shape (lamina/layers/gemv_rows.py, at
# warm-up), or, for a shape not measured, where rows x weight elements stay within GEMV_ROW_ELEMENTS (8M: 16 MB of
# bf16 at one row). Each row of x is reduced against every weight tile, so the GEMV's time grows with M x N x K
# while cuBLAS's stays flat at these rows; on small weights every kernel is a few microseconds of latency and
# cuBLAS's, launched without PDL, end the overlap of the kernels around them (a verify step of the demo model:
# lamina.kernels.pdl). The sweep behind the 8M: python -m lamina.bench.gemv_sweep --rows 2,4,8 on the H200
# (docs/kernels.md).
GEMV_ROW_ELEMENTS = 1 << 23


def gemv_for(x: torch.Tensor, weight: torch.Tensor, kernels: KernelChoice) -> ModuleType | None:
    """lamina.kernels.gemv when `kernels.gemv`, x is a 16-bit CUDA tensor of rows that the GEMV takes for this
    weight (gemv_takes), the weight is contiguous and in x's dtype, and triton imports; else None (cuBLAS)."""
    if not (kernels.gemv and on_kernel_device(x) and x.dtype in GEMV_DTYPES
            and weight.dtype == x.dtype and weight.is_contiguous()):
        return None
    gemv = _gemv_module()
    if gemv is None:
        return None
    rows = x.numel() // max(1, x.shape[-1])
    return gemv if gemv_takes(weight, rows, gemv.MAX_M) else None


def gemv_takes(weight: torch.Tensor, rows: int, most: int) -> bool:
    """Whether the GEMV (of at most `most` rows) computes `rows` rows of x against `weight`: up to GEMV_MAX_ROWS
    always; more where it was measured faster at this weight's shape (gemv_rows.py), or, not measured, up to
    gemv_max_rows."""
    if not 1 <= rows <= most:
        return False
    measured = gemv_is_faster(weight, rows) if rows > GEMV_MAX_ROWS else None
    return measured if measured is not None else rows <= gemv_max_rows(weight, most)


def gemv_max_rows(weight: torch.Tensor, most: int) -> int:
    """The most rows of x that the GEMV takes for `weight` where its rows were not measured (gemv_rows.py), given
    the kernel's limit `most`: as many as keep rows x weight elements within GEMV_ROW_ELEMENTS, GEMV_MAX_ROWS at
    least."""
    return min(most, max(GEMV_MAX_ROWS, GEMV_ROW_ELEMENTS // max(1, weight.numel())))


# Rows up to which a float32 CPU matmul x @ W.T may run as (W @ x.T).T (weight_major_for): where that is faster
# depends on the CPU (faster on one 2-core machine, slower on another: docs/BENCHMARKS.md), so it is measured per
# weight shape (lamina/layers/cpu_matmul.py); from 12 rows on the two were within noise.
CPU_WEIGHT_MAJOR_MAX_ROWS = 8


def weight_major_for(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether small_batch_matmul computes x @ W.T as (W @ x.T).T: a float32 CPU x of 1..CPU_WEIGHT_MAJOR_MAX_ROWS
    rows, a float32 weight, and weight-major measured faster at that shape on this machine."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32:
        return False
    rows = x.numel() // max(1, x.shape[-1])
    return 1 <= rows <= CPU_WEIGHT_MAJOR_MAX_ROWS and weight_major_is_faster(weight, rows)


def _token_quant_module() -> ModuleType | None:
    return kernel_module("token_quant")


def token_quant_for(x: torch.Tensor) -> ModuleType | None:
    """lamina.kernels.token_quant (per-token int8 / fp8 activation quantization, W8A8) for a 2-D CUDA x of
    a FUSED_DTYPES dtype with contiguous rows, when triton imports; else None (the torch ops)."""
    if not (on_kernel_device(x) and x.dtype in FUSED_DTYPES and x.dim() == 2 and x.stride(-1) == 1):
        return None
    return _token_quant_module()


def _fp8_gemm_module() -> ModuleType | None:
    return kernel_module("fp8_gemm")


@functools.cache
def device_name(device: torch.device) -> str:
    """The name the measured kernel tables are keyed by: the GPU's ("NVIDIA H200"), else the device type."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def fp8_gemm_for(x_q: torch.Tensor, w_q: torch.Tensor,
                 kernels: KernelChoice = DEFAULT_KERNELS) -> tuple[ModuleType, Fp8GemmConfig] | None:
    """(lamina.kernels.fp8_gemm, its config) for fp8 operands x_q [M, K] @ w_q[N, K]^T on CUDA, rows contiguous,
    when `kernels.gemv` allows decode-sized kernels and the device's measured table
    (lamina/kernels/configs/fp8_gemm.json) names a config for M rows of this weight shape; else None
    (torch._scaled_mm, which the table found faster, or the reference path)."""
    if not (kernels.gemv and on_kernel_device(x_q) and x_q.dim() == 2 and x_q.stride(-1) == 1
            and w_q.stride(-1) == 1):
        return None
    module = _fp8_gemm_module()
    if module is None:
        return None
    config = module.config_for(x_q.shape[0], *w_q.shape, module.device_table(device_name(x_q.device)))
    return None if config is None else (module, config)
