"""Which float32 CPU matmul computes a few rows faster on this machine: measured once per weight shape.

    F.linear(x, W)      MKL's own choice for x [m, K] @ W[N, K].T
    (W @ x.T).T         weight-major (weight_major_matmul below): the weight is the GEMM's streamed operand

Which wins depends on the CPU, not on the shapes alone. On the 2-core AMD EPYC of earlier sessions MKL took a
one-thread GEMV at 1 row and a slow small-M GEMM at 2-8 rows, and weight-major was ~2.5x faster over the demo
model's weights; on a 2-core Intel Xeon (AVX-512, 300 MiB L3) F.linear is ~3-4x faster at one row and weight-major
made the demo model's decode 1.4-1.9x slower (docs/BENCHMARKS.md, thirty-second session). So the first few-row
matmul of each weight shape times both at 1, 2, 4 and 8 rows (ROW_BUCKETS; 3-4 rows take 4's answer, 5-8 take 8's)
and keeps the faster; F.linear unless weight-major is faster by MARGIN (in doubt, the standard path). A shape
costs ~4 x 2 x (1 + ROUNDS) of its matmuls once: tens of milliseconds for the demo model's five shapes. The two
paths differ only in float rounding (the order of the sums), and a process keeps its choices.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

Matmul = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

ROW_BUCKETS = (1, 2, 4, 8)
ROUNDS = 5  # timed calls of each matmul per bucket, interleaved (after one untimed call of each)
MARGIN = 0.1  # weight-major must be this much faster (by medians) to be chosen

_choices: dict[tuple[int, int, int], bool] = {}  # (N, K, row bucket) -> whether weight-major is faster


def row_bucket(rows: int) -> int:
    """The timed row count that answers for `rows` (1..ROW_BUCKETS[-1]): the smallest bucket at or above it."""
    return next(b for b in ROW_BUCKETS if b >= rows)


def weight_major_is_faster(weight: torch.Tensor, rows: int) -> bool:
    """Whether (W @ x.T).T beats F.linear for x of `rows` rows and this weight's shape, timing both the first
    time the shape is asked about."""
    key = (weight.shape[0], weight.shape[1], row_bucket(rows))
    if key not in _choices:
        _choices.update(calibrate(weight, linear=F.linear, weight_major=weight_major_matmul))
    return _choices[key]


def weight_major_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight[N, K].T as (weight @ x.T).T: the weight is the GEMM's streamed operand. A single row is
    doubled (by `cat`, cheaper than `repeat`), since one column would take MKL's GEMV path again."""
    rows = x.reshape(-1, x.shape[-1])
    m = rows.shape[0]
    out = (weight @ (torch.cat((rows, rows)) if m == 1 else rows).t()).t()[:m]
    out = (out + bias if bias is not None else out).contiguous()  # the sum keeps the transposed strides
    return out.view(*x.shape[:-1], weight.shape[0])


def calibrate(weight: torch.Tensor, linear: Matmul, weight_major: Matmul,
              clock: Callable[[], float] = time.perf_counter) -> dict[tuple[int, int, int], bool]:
    """Time `linear` and `weight_major` on `weight` at each of ROW_BUCKETS rows (ROUNDS interleaved calls each,
    after one untimed call of each): {(N, K, rows): weight-major faster by MARGIN}."""
    n, k = weight.shape
    choices = {}
    with torch.inference_mode():
        for rows in ROW_BUCKETS:
            x = torch.randn(rows, k, dtype=weight.dtype)
            seconds: tuple[list[float], list[float]] = ([], [])
            for matmul in (linear, weight_major):
                matmul(x, weight)
            for _ in range(ROUNDS):
                for times, matmul in zip(seconds, (linear, weight_major)):
                    start = clock()
                    matmul(x, weight)
                    times.append(clock() - start)
            choices[n, k, rows] = statistics.median(seconds[1]) < (1 - MARGIN) * statistics.median(seconds[0])
    return choices
