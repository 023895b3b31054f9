"""GEMV for the decode step: out = x @ weight.T (+ bias) for a handful of rows (M <= MAX_M).

    x       [M, K]   rows may be strided (a view), last stride 1
    weight  [N, K]   row-major contiguous (the checkpoint's layout: read once, coalesced along K)
    bias    [N] or None
    out     [M, N]   x's dtype; fp32 products and sums, one rounding at the end (like F.linear)

At batch 1 a linear layer is a pure weight stream; on the decode-sized matrices (4 MB - 1 GB of bf16)
cuBLAS reaches 0.3-4.2 TB/s of the H200's 4.63 (lamina/bench/gemv_sweep.py). Grid (cdiv(N, BLOCK_N),
SPLIT_K): program (n, s) owns output rows [n * BLOCK_N, (n + 1) * BLOCK_N) and the K range

    k_per_split = cdiv(cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K   (whole tiles; host-computed)
    [s * k_per_split, min((s + 1) * k_per_split, K))          (may be empty: it then adds zeros)

and walks it in [BLOCK_N, BLOCK_K] weight tiles; each tile is loaded once, converted to fp32 and
reduced against every row of x (M is a constexpr: up to MAX_M accumulators, unrolled at compile time):

    acc_m[BLOCK_N] += sum_k w[BLOCK_N, BLOCK_K] * x[m, BLOCK_K]

Row m's sums are the same operations in the same order whatever M is (the config depends on N and K only), so
a row's output does not depend on the rows beside it: a verify step's rows equal a one-row step's bit for bit.

Rows past N are clamped to N - 1 for the loads (unmasked, vectorised) and masked at the store; K is
masked only when BLOCK_K does not divide it (EVEN_K). SPLIT_K == 1 adds the bias and rounds in the
epilogue. SPLIT_K > 1 writes fp32 partials to a workspace [SPLIT_K, M, N] and a second kernel, grid
(cdiv(M * N, REDUCE_BLOCK),), sums them in split order, adds the bias and rounds. Both passes are
deterministic and capturable in a CUDA graph (no host sync; buffers sized by shapes only).

Importing this module imports triton; lamina.layers.linear.small_batch_matmul imports it on the first
CUDA call with at most MAX_M rows (every linear layer and the LM head of a decode step).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lamina.kernels import pdl

MAX_M = 8
INTERPRETER_SMS = 132  # CPU tensors (Triton's interpreter) plan as if on an H200, where the tiles were swept
REDUCE_BLOCK = 256
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class GemvConfig:
    block_n: int  # output rows per program (power of two)
    block_k: int  # K elements per weight tile (power of two)
    split_k: int = 1  # programs along K; > 1 adds the fp32 workspace and the reduce pass
    num_warps: int = 4
    num_stages: int = 1  # > 1 lets Triton software-pipeline the tile loads of the K loop

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k", "num_warps"):
            value = getattr(self, name)
            assert value >= 1 and value & (value - 1) == 0, f"{name} must be a power of two, got {value}"
        assert self.split_k >= 1 and self.num_stages >= 1, "split_k and num_stages must be >= 1"

    @property
    def name(self) -> str:
        return f"n{self.block_n}-k{self.block_k}-s{self.split_k}-w{self.num_warps}-p{self.num_stages}"


CANDIDATE_CONFIGS: list[GemvConfig] = [
    # one K tile per program (K <= BLOCK_K) or a few: every load of a program in flight at once
    GemvConfig(1, 1024, 1, 4, 1),
    GemvConfig(2, 1024, 1, 4, 1),
    GemvConfig(4, 1024, 1, 4, 1),
    GemvConfig(8, 1024, 1, 4, 1),
    GemvConfig(2, 1024, 1, 2, 1),
    GemvConfig(1, 2048, 1, 4, 1),
    GemvConfig(2, 2048, 1, 4, 1),
    GemvConfig(2, 2048, 1, 8, 1),
    GemvConfig(1, 4096, 1, 4, 1),
    GemvConfig(1, 4096, 1, 8, 1),
    GemvConfig(2, 4096, 1, 8, 1),
    # K loops with num_stages > 1 (no measurable effect on the H200 so far), and narrower tiles
    GemvConfig(1, 1024, 1, 4, 3),
    GemvConfig(2, 1024, 1, 4, 3),
    GemvConfig(1, 2048, 1, 4, 3),
    GemvConfig(4, 512, 1, 4, 3),
    GemvConfig(8, 512, 1, 4, 2),
    GemvConfig(16, 256, 1, 4, 2),
    # split K: more programs for N = 1024, at the price of the reduce launch
    GemvConfig(2, 1024, 2, 4, 1),
    GemvConfig(4, 1024, 3, 4, 1),
    GemvConfig(8, 1024, 4, 4, 1),
]

_MIN_TILE = 2048  # weight-tile elements: 4 KB of bf16
_PER_WARP = 512  # tile elements per warp: two 16-byte loads per thread
PROGRAMS_PER_SM = 4  # a full wave with ~4 resident programs per SM


@functools.cache
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of `device`'s GPU (asked once per device)."""
    if device.type != "cuda":
        return INTERPRETER_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.lru_cache(maxsize=None)  # a pure function of the shape, asked on every call
def default_config(n: int, k: int, sms: int = INTERPRETER_SMS) -> GemvConfig:
    """Whole rows, small tiles, many programs: the measured best on the H200 (lamina/bench/gemv_sweep.py
    at M = 1, bf16: within 3% of the best candidate on all ten Qwen3-0.6B / Llama-3-8B shapes).

    A batch-1 GEMV is a latency-bound stream: ~4.6 TB/s at ~1 us of loaded latency needs ~35 KB of
    loads in flight per SM, and a program's loads are in flight together only within one K iteration.
    So K <= 4096 is taken in one tile (whole rows, no loop), longer K in tiles of the largest power of
    two <= 2048 dividing it; a tile is one row, or as many as make it 2048 elements, and the warps
    give each thread two 16-byte loads. Small programs make up in numbers what each holds in flight:
    up to 16 resident per SM, an even spread over the `sms` SMs (132 on the H200), a short tail. Measured, not chosen:
    split K never won (its reduce launch costs more than the extra programs give), num_stages changed
    nothing, bigger tiles and more loads per thread lost 5-40%.
    """
    assert n >= 1 and k >= 1, "empty shape"
    if k <= 4096:
        block_k = triton.next_power_of_2(k)
    else:
        block_k = 2048
        while block_k > 256 and k % block_k:
            block_k //= 2
    block_n = max(1, min(64, _MIN_TILE // block_k))
    while block_n > 1 and triton.cdiv(n, block_n) < PROGRAMS_PER_SM * sms:
        block_n //= 2
    num_warps = max(1, min(8, block_n * block_k // _PER_WARP))
    return GemvConfig(block_n, block_k, 1, num_warps=num_warps, num_stages=1)


@triton.jit
def _accumulate(acc, w, x_row_ptr, offs_k, k_mask, EVEN_K: tl.constexpr):
    """acc[BLOCK_N] + w[BLOCK_N, BLOCK_K] @ x_row[BLOCK_K], in fp32."""
    if EVEN_K:
        x = tl.load(x_row_ptr + offs_k)
    else:
        x = tl.load(x_row_ptr + offs_k, mask=k_mask, other=0.0)
    return acc + tl.sum(w * x.to(tl.float32)[None, :], axis=1)


@triton.jit
def _finish_row(acc, m: tl.constexpr, rows, row_mask, b_ptr, out_ptr, ws_ptr, stride_om, N,
                M: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr):
    """Row m of the output (bias + one rounding), or this split's fp32 partial of it."""
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + m * stride_om + rows, acc.to(out_ptr.dtype.element_ty), mask=row_mask)
    else:
        tl.store(ws_ptr + (tl.program_id(1) * M + m) * N + rows, acc, mask=row_mask)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, out_ptr, ws_ptr, N, K, stride_xm, stride_wn, stride_om, k_per_split,
                 M: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    pdl.launch_dependents(PDL)  # first, unlike the weight-only GEMVs (lamina.kernels.pdl: measured)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    w_rows = w_ptr + tl.minimum(rows, N - 1).to(tl.int64)[:, None] * stride_wn  # clamped: unmasked loads
    k_start = tl.program_id(1) * k_per_split
    k_stop = tl.minimum(k_start + k_per_split, K)
    acc0 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc4 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc5 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc6 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc7 = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k in range(k_start, k_stop, BLOCK_K):
        offs_k = k + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        if EVEN_K:
            w = tl.load(w_rows + offs_k[None, :], eviction_policy="evict_first")
        else:
            w = tl.load(w_rows + offs_k[None, :], mask=k_mask[None, :], other=0.0, eviction_policy="evict_first")
        pdl.wait(PDL)  # the first tile of weights is on its way; x may be the kernel before's output (a no-op after)
        w = w.to(tl.float32)
        acc0 = _accumulate(acc0, w, x_ptr, offs_k, k_mask, EVEN_K)
        if M > 1:
            acc1 = _accumulate(acc1, w, x_ptr + stride_xm, offs_k, k_mask, EVEN_K)
        if M > 2:
            acc2 = _accumulate(acc2, w, x_ptr + 2 * stride_xm, offs_k, k_mask, EVEN_K)
        if M > 3:
            acc3 = _accumulate(acc3, w, x_ptr + 3 * stride_xm, offs_k, k_mask, EVEN_K)
        if M > 4:
            acc4 = _accumulate(acc4, w, x_ptr + 4 * stride_xm, offs_k, k_mask, EVEN_K)
        if M > 5:
            acc5 = _accumulate(acc5, w, x_ptr + 5 * stride_xm, offs_k, k_mask, EVEN_K)
        if M > 6:
            acc6 = _accumulate(acc6, w, x_ptr + 6 * stride_xm, offs_k, k_mask, EVEN_K)
        if M > 7:
            acc7 = _accumulate(acc7, w, x_ptr + 7 * stride_xm, offs_k, k_mask, EVEN_K)
    pdl.wait(PDL)  # a split past K never entered the loop
    _finish_row(acc0, 0, rows, row_mask, b_ptr, out_ptr, ws_ptr, stride_om, N, M, HAS_BIAS, SPLIT_K)
    if M > 1:
        _finish_row(acc1, 1, rows, row_mask, b_ptr, out_ptr, ws_ptr, stride_om, N, M, HAS_BIAS, SPLIT_K)
    if M > 2:
        _finish_row(acc2, 2, rows, row_mask, b_ptr, out_ptr, ws_ptr, stride_om, N, M, HAS_BIAS, SPLIT_K)
    if M > 3:
        _finish_row(acc3, 3, rows, row_mask, b_ptr, out_ptr, ws_ptr, stride_om, N, M, HAS_BIAS, SPLIT_K)
    if M > 4:
        _finish_row(acc4, 4, rows, row_mask, b_ptr, out_ptr, ws_ptr, stride_om, N, M, HAS_BIAS, SPLIT_K)
    if M > 5:
        _finish_row(acc5, 5, rows, row_mask, b_ptr, out_ptr, ws_ptr, stride_om, N, M, HAS_BIAS, SPLIT_K)
    if M > 6:
        _finish_row(acc6, 6, rows, row_mask, b_ptr, out_ptr, ws_ptr, stride_om, N, M, HAS_BIAS, SPLIT_K)
    if M > 7:
        _finish_row(acc7, 7, rows, row_mask, b_ptr, out_ptr, ws_ptr, stride_om, N, M, HAS_BIAS, SPLIT_K)


@triton.jit
def _split_k_reduce_kernel(ws_ptr, b_ptr, out_ptr, N, MN, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr,
                           BLOCK: tl.constexpr):
    """out[M, N] (contiguous, flattened) = sum_s ws[s] (+ bias), rounded once."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + s * MN + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _check_inputs(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    assert x.dim() == 2, f"x must be [M, K], got shape {tuple(x.shape)}"
    assert weight.dim() == 2, f"weight must be [N, K], got shape {tuple(weight.shape)}"
    assert x.dtype in _DTYPES, f"unsupported dtype {x.dtype}"
    assert weight.dtype == x.dtype, f"dtype mismatch: x {x.dtype}, weight {weight.dtype}"
    assert x.shape[0] <= MAX_M, f"gemv takes at most MAX_M = {MAX_M} rows of x, got {x.shape[0]}"
    assert weight.shape[1] == x.shape[1], f"K mismatch: x {tuple(x.shape)}, weight {tuple(weight.shape)}"
    assert x.shape[1] >= 1, "K must be >= 1"
    assert weight.is_contiguous(), "weight must be a contiguous [N, K] (row-major) tensor"
    assert x.stride(1) == 1 or x.shape[1] == 1, "x's last dim must be contiguous (stride 1)"
    assert weight.device == x.device, f"device mismatch: x on {x.device}, weight on {weight.device}"
    if bias is not None:
        assert bias.shape == (weight.shape[0],), f"bias must be [N] = [{weight.shape[0]}], got {tuple(bias.shape)}"
        assert bias.dtype == x.dtype, f"dtype mismatch: x {x.dtype}, bias {bias.dtype}"
        assert bias.device == x.device, f"device mismatch: x on {x.device}, bias on {bias.device}"


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         config: GemvConfig | None = None, pdl: bool = False) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T (+ bias [N]) -> [M, N] in x's dtype, for 1 <= M <= MAX_M; pdl: launch with
    programmatic dependent launch (lamina.kernels.pdl; the split-K reduce, when there is one, launches plainly)."""
    _check_inputs(x, weight, bias)
    (m, k), n = x.shape, weight.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    cfg = config or default_config(n, k, num_sms(x.device))
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.block_k), cfg.split_k) * cfg.block_k
    ws = out if cfg.split_k == 1 else torch.empty((cfg.split_k, m, n), dtype=torch.float32, device=x.device)
    b = out if bias is None else bias  # never read without HAS_BIAS
    _gemv_kernel[(triton.cdiv(n, cfg.block_n), cfg.split_k)](
        x, weight, b, out, ws, n, k, x.stride(0), weight.stride(0), out.stride(0), k_per_split,
        M=m, HAS_BIAS=bias is not None, SPLIT_K=cfg.split_k, EVEN_K=k % cfg.block_k == 0,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, PDL=pdl, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        launch_pdl=pdl)
    if cfg.split_k > 1:
        _split_k_reduce_kernel[(triton.cdiv(m * n, REDUCE_BLOCK),)](
            ws, b, out, n, m * n, HAS_BIAS=bias is not None, SPLIT_K=cfg.split_k, BLOCK=REDUCE_BLOCK,
            num_warps=2)
    return out
