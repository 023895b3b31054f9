"""Whether the GEMV or cuBLAS computes a few rows of x faster, per weight shape on this GPU: measured at warm-up.

    x [M, K] @ W[N, K].T, 2 <= M <= 8 (a verify step's rows, a small batch's decode)
        lamina.kernels.gemv    reduces each row of x against every weight tile: its time grows with M x N x K
        cuBLAS (F.linear)      its time stays flat at these rows, but its kernel choice per shape varies

Which wins is not a function of the element count: of two weights of ~3M elements (the demo model's LM head,
Qwen3-0.6B's down projection) the GEMV lost on one and won on the other at 2 rows (docs/BENCHMARKS.md, forty-second
and forty-third sessions). So the warm-up times both at 2, 4 and 8 rows (ROW_BUCKETS; 3 rows take 4's answer, 5-8
take 8's) for each weight shape of the model and keeps the one faster by MARGIN; a tie, or a shape not measured,
keeps dispatch's rule by element count.

Each kernel is timed as a step runs it: CALLS calls captured in one CUDA graph, the graph replayed REPLAYS times
between two events, ROUNDS such bursts of each kernel interleaved. Timed eagerly, every GEMV call would pay
Triton's host-side launch (~20 us), and the GEMV lost every shape that way (forty-third session). A burst reads
one weight again and again, from L2, as a model does from step to step only when all its weights fit in L2: only
such a model is timed (`fits_in_l2`). A larger model's steps stream their weights from HBM, as
lamina.bench.gemv_sweep's rotating copies do, and the rule by element count came from those sweeps.
"""
from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

Matmul = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# prepares bursts of a call (compiling it first, outside any capture); the function it returns runs one burst and
# gives the seconds one call took
Burst = Callable[[Callable[[], object]], Callable[[], float]]

ROW_BUCKETS = (2, 4, 8)
ROUNDS = 5  # timed bursts of each kernel per bucket, interleaved
CALLS = 16  # calls captured in a burst's graph
REPLAYS = 4  # replays of the graph a burst (the first replay's launch gap spread thin)
MARGIN = 0.05  # the faster kernel's median must be this much below the other's; else a tie (the rule decides)

# (N, K, dtype, row bucket) -> whether the GEMV is faster (None: a tie)
_choices: dict[tuple[int, int, torch.dtype, int], bool | None] = {}


def row_bucket(rows: int) -> int | None:
    """The timed row count that answers for `rows`: the smallest of ROW_BUCKETS at or above it (None: more rows
    than any)."""
    return next((b for b in ROW_BUCKETS if b >= rows), None)


def gemv_is_faster(weight: torch.Tensor, rows: int) -> bool | None:
    """Whether the GEMV beat cuBLAS for `rows` rows of x at this weight's shape (None: not measured, or a tie)."""
    return _choices.get((weight.shape[0], weight.shape[1], weight.dtype, row_bucket(rows)))


def fits_in_l2(weights: Iterable[torch.Tensor], l2_bytes: int) -> bool:
    """Whether `weights` together fit in an L2 cache of `l2_bytes` (then a step finds them there, as a burst does)."""
    return sum(w.numel() * w.element_size() for w in weights) <= l2_bytes


def graph_burst(fn: Callable[[], object]) -> Callable[[], float]:
    """CALLS calls of `fn` captured in a CUDA graph (after one eager call: compiles, cuBLAS's handle); returns the
    timer of a burst: REPLAYS replays between two events on the current stream, seconds per call."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()

    def timed() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(REPLAYS):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000 / (REPLAYS * CALLS)

    timed()  # the first replay uploads the graph
    return timed


def pending(weights: Iterable[torch.Tensor]) -> list[tuple[torch.Tensor, int]]:
    """(weight, rows) of every bucket not measured yet, one weight per (shape, dtype)."""
    todo: dict[tuple[int, int, torch.dtype, int], tuple[torch.Tensor, int]] = {}
    for weight in weights:
        for rows in ROW_BUCKETS:
            key = (weight.shape[0], weight.shape[1], weight.dtype, rows)
            if key not in _choices:
                todo.setdefault(key, (weight, rows))
    return list(todo.values())


def first_calls(todo: list[tuple[torch.Tensor, int]], gemv: Matmul) -> None:
    """One GEMV call of each pending bucket: under lamina.worker.warmup.precompile, what compiles its variants
    together before they are timed."""
    for weight, rows in todo:
        gemv(_rows_of(weight, rows), weight)


def calibrate(todo: list[tuple[torch.Tensor, int]], gemv: Matmul, burst: Burst = graph_burst) -> dict[str, int]:
    """Time `gemv` against F.linear on each pending (weight, rows) and keep the choices once all are timed (a
    failure keeps none); returns how many buckets went to each kernel ({"gemv": .., "cublas": .., "tie": ..})."""
    choices = {}
    for weight, rows in todo:
        x = _rows_of(weight, rows)
        timers = (burst(lambda: gemv(x, weight)), burst(lambda: F.linear(x, weight)))  # noqa: B023 (used here)
        seconds: tuple[list[float], list[float]] = ([], [])
        for _ in range(ROUNDS):
            for times, timer in zip(seconds, timers):
                times.append(timer())
        gemv_s, cublas_s = statistics.median(seconds[0]), statistics.median(seconds[1])
        choices[weight.shape[0], weight.shape[1], weight.dtype, rows] = _faster(gemv_s, cublas_s)
        logger.debug("GEMV against cuBLAS, %s x %d rows: %.2f / %.2f us", tuple(weight.shape), rows, gemv_s * 1e6,
                    cublas_s * 1e6)
    _choices.update(choices)
    return {name: sum(c is won for c in choices.values()) for name, won in (("gemv", True), ("cublas", False),
                                                                          ("tie", None))}


def linear_weights(model: torch.nn.Module, dtypes: tuple[torch.dtype, ...]) -> list[torch.Tensor]:
    """The model's 2-D contiguous parameters named `weight` in `dtypes`: its linear layers', its LM head's (an
    untied embedding table too, which costs a few timed calls; not a quantized layer's scales)."""
    return [param for name, param in model.named_parameters() if name.rpartition(".")[2] == "weight"
            and param.dim() == 2 and param.dtype in dtypes and param.is_contiguous()]


def _faster(gemv_s: float, cublas_s: float) -> bool | None:
    """True: the GEMV by MARGIN; False: cuBLAS by MARGIN; None: a tie."""
    if gemv_s < (1 - MARGIN) * cublas_s:
        return True
    return False if cublas_s < (1 - MARGIN) * gemv_s else None


def _rows_of(weight: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.randn(rows, weight.shape[1], dtype=weight.dtype, device=weight.device)
