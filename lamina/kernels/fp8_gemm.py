"""FP8 W8A8 GEMM for decode-sized batches, row-wise scales: out = (x_q @ w_q^T) * s_x * s_w^T.

    x_q  [M, K] float8_e4m3fn, rows contiguous      s_x [M, 1] float32 (one scale a token)
    w_q  [N, K] float8_e4m3fn, rows contiguous      s_w [N, 1] float32 (one scale an output channel)
    out  [M, N] bf16 / fp16 / fp32: fp32 accumulation, one rounding after the scales

The peer is torch._scaled_mm's row-wise path (lamina/quant/w8a8.py), which at W1's few rows a step streams the
8B shape's fp8 weights at ~2.4 TB/s (docs/BENCHMARKS.md, thirteenth session). Here a program owns BLOCK_N weight
rows and BLOCK_M batch rows and walks K in BLOCK_K tiles (software-pipelined over num_stages), so with
BLOCK_M >= M every weight byte is read once:

    grid (cdiv(N, BLOCK_N), cdiv(M, BLOCK_M))      program (j, i): out[i*BLOCK_M : .., j*BLOCK_N : ..]
    SWAP False: acc [BLOCK_M, BLOCK_N] = x_tile @ w_tile^T
    SWAP True:  acc [BLOCK_N, BLOCK_M] = w_tile @ x_tile^T   (weight rows fill the MMA's M side, 64 on sm_90;
                                                              a small batch its N side, 16 and up)

Rows past M or N re-read the last row (never stored); a K tail is masked. Each K tile's products join the fp32
accumulator at full precision (max_num_imprecise_acc = BLOCK_K: Hopper's fp8 MMA keeps fewer accumulator bits,
and cuBLAS promotes likewise unless asked for fast accumulation).

Which config for which (M, N, K) is measured, not guessed: `python -m lamina.bench.fp8_gemm_sweep --write-table`
times every candidate against the peer on the device and writes lamina/kernels/configs/fp8_gemm.json, keyed by
device name, then weight shape "NxK", then a list of [max rows, config or null]: the first entry whose max rows
is >= M applies, null (or no entry, or no table for the device) means the peer. Importing this module imports
triton.
"""
from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

TABLE_PATH = Path(__file__).with_name("configs") / "fp8_gemm.json"


@dataclass(frozen=True)
class Fp8GemmConfig:
    block_m: int  # batch rows a program (16 and up; the MMA's N side when swap)
    block_n: int  # weight rows a program
    block_k: int = 128
    swap: bool = False
    num_warps: int = 4
    num_stages: int = 4

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name}: a power of two >= 16 is needed, got {value}")

    @property
    def name(self) -> str:
        return (f"m{self.block_m}-n{self.block_n}-k{self.block_k}-w{self.num_warps}-s{self.num_stages}"
                f"{'-swap' if self.swap else ''}")


Table = dict[str, list[tuple[int, Fp8GemmConfig | None]]]  # "NxK" -> [(max rows, config or None: the peer)]


def parse_table(entries: dict[str, list], where: str = "fp8 GEMM table") -> Table:
    """A device's entries as read from JSON ("NxK": [[max rows, config dict or null], ...], rows ascending) ->
    Table; ValueError naming `where`, the shape and what is wrong otherwise."""
    table: Table = {}
    for shape, buckets in entries.items():
        try:
            n, k = (int(v) for v in shape.split("x"))
            parsed = [(int(rows), None if cfg is None else Fp8GemmConfig(**cfg)) for rows, cfg in buckets]
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where}: shape {shape!r}: expected \"NxK\": [[max rows, config or null], ...] with "
                             f"config fields {list(Fp8GemmConfig.__dataclass_fields__)} ({err})") from err
        rows = [r for r, _ in parsed]
        if n < 1 or k < 1 or not rows or rows[0] < 1 or rows != sorted(set(rows)):
            raise ValueError(f"{where}: shape {shape!r}: positive N, K and max rows strictly ascending from 1 up "
                             f"are needed, got rows {rows}")
        table[shape] = parsed
    return table


def table_json(table: Table) -> dict[str, list]:
    return {shape: [[rows, None if cfg is None else asdict(cfg)] for rows, cfg in buckets]
            for shape, buckets in table.items()}


@functools.cache
def device_table(device_name: str, path: Path = TABLE_PATH) -> Table:
    """The measured table of `device_name` (empty when the file or the device has none)."""
    if not path.exists():
        return {}
    try:
        tables = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    return parse_table(tables.get(device_name, {}), f"{path}, device {device_name!r}")


def config_for(m: int, n: int, k: int, table: Table) -> Fp8GemmConfig | None:
    """The config measured fastest for M rows of weight shape [N, K]; None: torch._scaled_mm was faster, or the
    shape or M is not in the table."""
    for max_rows, cfg in table.get(f"{n}x{k}", ()):
        if m <= max_rows:
            return cfg
    return None


@triton.jit
def _fp8_gemm_kernel(x_ptr, w_ptr, sx_ptr, sw_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om, stride_sx,
                     stride_sw, SWAP: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    xm = tl.minimum(rm, M - 1).to(tl.int64)
    wn = tl.minimum(rn, N - 1).to(tl.int64)
    x_ptrs = x_ptr + xm[:, None] * stride_xm + rk[None, :]  # [BLOCK_M, BLOCK_K]
    w_ptrs = w_ptr + wn[:, None] * stride_wn + rk[None, :]  # [BLOCK_N, BLOCK_K]
    if SWAP:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs)
            w = tl.load(w_ptrs, eviction_policy="evict_first")
        else:
            in_k = (k0 + rk < K)[None, :]
            x = tl.load(x_ptrs, mask=in_k, other=0.0)
            w = tl.load(w_ptrs, mask=in_k, other=0.0, eviction_policy="evict_first")
        if SWAP:
            acc = tl.dot(w, tl.trans(x), acc, max_num_imprecise_acc=BLOCK_K)
        else:
            acc = tl.dot(x, tl.trans(w), acc, max_num_imprecise_acc=BLOCK_K)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    sx = tl.load(sx_ptr + xm * stride_sx)  # stride 0: one static scale for every token
    sw = tl.load(sw_ptr + wn * stride_sw)
    om = rm.to(tl.int64)
    if SWAP:
        out = acc * sw[:, None] * sx[None, :]
        ptrs = out_ptr + om[None, :] * stride_om + rn[:, None]
        mask = (rm[None, :] < M) & (rn[:, None] < N)
    else:
        out = acc * sx[:, None] * sw[None, :]
        ptrs = out_ptr + om[:, None] * stride_om + rn[None, :]
        mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(ptrs, out.to(out_ptr.dtype.element_ty), mask=mask)


def fp8_gemm(x_q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
             out_dtype: torch.dtype, config: Fp8GemmConfig) -> torch.Tensor:
    """(x_q @ w_q^T) * x_scale * w_scale^T as out_dtype [M, N] (the module docstring's operands; x_scale may be
    one static scale expanded over the rows). ValueError naming the operand when one does not fit."""
    _check(x_q, w_q, x_scale, w_scale)
    (m, k), n = x_q.shape, w_q.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=x_q.device)
    if m == 0 or n == 0:
        return out
    sx, sw = x_scale.float(), w_scale.float()
    c = config
    grid = (triton.cdiv(n, c.block_n), triton.cdiv(m, c.block_m))
    _fp8_gemm_kernel[grid](x_q, w_q, sx, sw, out, m, n, k, x_q.stride(0), w_q.stride(0), out.stride(0),
                           sx.stride(0), sw.stride(0), SWAP=c.swap, EVEN_K=k % c.block_k == 0, BLOCK_M=c.block_m,
                           BLOCK_N=c.block_n, BLOCK_K=c.block_k, num_warps=c.num_warps, num_stages=c.num_stages)
    return out


def _check(x_q: torch.Tensor, w_q: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor) -> None:
    fp8 = torch.float8_e4m3fn
    for name, t in (("x_q", x_q), ("w_q", w_q)):
        if t.dtype != fp8 or t.dim() != 2 or t.stride(1) != 1:
            raise ValueError(f"fp8_gemm: {name} must be a 2-D float8_e4m3fn tensor with contiguous rows, got "
                             f"{t.dtype} {tuple(t.shape)} strides {t.stride()}")
    if x_q.shape[1] != w_q.shape[1]:
        raise ValueError(f"fp8_gemm: x_q [M, K] and w_q [N, K] must share K, got {tuple(x_q.shape)} and "
                         f"{tuple(w_q.shape)}")
    for name, t, rows in (("x_scale", x_scale, x_q.shape[0]), ("w_scale", w_scale, w_q.shape[0])):
        if tuple(t.shape) != (rows, 1):
            raise ValueError(f"fp8_gemm: {name} must be [{rows}, 1] (one scale a row), got {tuple(t.shape)}")
