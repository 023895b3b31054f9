"""Compile the kernels of every kind of step before the first request.

Triton compiles a kernel the first time it meets a new combination of its constexprs: for the
attention kernels, the decode kernel's MAX_Q (1: pure decode; DECODE_MAX_Q: decode rows mixed with
a prefill) and split / no split, the prefill kernel's short / long tiles; for the GEMV, its row count
M (lamina.layers.dispatch.gemv_takes: up to 8 rows of the weights where it beats cuBLAS). CUDA-graph capture
compiles the pure-decode graphs only.
Without this warm-up the other variants compile inside the first steps that need them, about a second each
on an H200 host (W1 lost 10 of its 16 seconds that way). The variants are compiled together, on a thread
pool (`precompile`), not one after another. First the GEMV is timed against cuBLAS at 2, 4 and 8 rows of each of
the model's weight shapes (lamina/layers/gemv_rows.py: which of the two a step of that many rows runs), so that the
batches below compile the GEMV variants that the steps will use. Each warm-up batch below is one eager forward
over the real KV cache that stores nothing (every slot -1) and reads only the null block 0:

    rows (q_len, seq_len)                                   compiles
    [(long, long), (1, max_model_len), (1, 17)]             prefill long tiles, decode MAX_Q=8 split
    [(64, 64), (1, 40), (8, 48)]                            prefill short tiles, decode MAX_Q=8 no split
    [(1, max_model_len), (1, 3)]                            decode MAX_Q=1 split (eager: graphs off)
    [(1, 30)] * m, m = 1..8                                 decode MAX_Q=1 no split, GEMV M=m (of the weights
                                                            that take m rows; more: cuBLAS)
    then the sampling kernel on one row of logits           temperature only; with top-p
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from lamina.attention.metadata import AttentionMetadata, set_attention_metadata
from lamina.kernels.tiles import LONG_QUERY
from lamina.layers import gemv_rows
from lamina.layers.dispatch import GEMV_DTYPES, kernel_module, pdl_for

logger = logging.getLogger(__name__)

Rows = list[tuple[int, int]]  # (q_len, seq_len) per sequence


def warmup_batches(max_num_batched_tokens: int, max_model_len: int) -> list[Rows]:
    """The warm-up batches (see the module docstring), clipped to the engine's limits."""
    long = max(9, min(LONG_QUERY, max_num_batched_tokens - 2, max_model_len))
    short_q = max(9, min(64, max_num_batched_tokens - 10, max_model_len))
    batches = [[(long, long), (1, max_model_len), (1, min(17, max_model_len))],
               [(short_q, short_q), (1, min(40, max_model_len)), (8, min(48, max_model_len))],
               [(1, max_model_len), (1, min(3, max_model_len))]]
    batches += [[(1, min(30, max_model_len))] * m for m in range(1, 9)]
    return [rows for rows in batches if sum(q for q, _ in rows) <= max_num_batched_tokens]


def null_block_metadata(rows: Rows, block_size: int, device: torch.device) -> AttentionMetadata:
    """Metadata of `rows` whose every token stores nothing and whose every key is in block 0."""
    starts = [0]
    for q_len, _ in rows:
        starts.append(starts[-1] + q_len)
    seq_lens = [seq_len for _, seq_len in rows]
    width = -(-max(seq_lens) // block_size)
    return AttentionMetadata(
        slot_mapping=torch.full((starts[-1],), -1, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=torch.zeros(len(rows), width, dtype=torch.int32, device=device),
        max_query_len=max(q for q, _ in rows), max_seq_len=max(seq_lens),
        query_start_loc_cpu=starts, seq_lens_cpu=seq_lens)


@torch.inference_mode()
def warm_up_kernels(model: torch.nn.Module, block_size: int, max_num_batched_tokens: int, max_model_len: int,
                    device: torch.device) -> None:
    """One eager forward (and logits for each sequence) per warm-up batch; the KV cache is untouched.

    The batches run twice: first with every kernel that is not compiled yet skipped, to learn which
    variants they need, which are then compiled together on a thread pool (`precompile`); then for real."""
    start = time.perf_counter()
    if device.type == "cuda":
        _time_gemv_rows(model, getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0))
    batches = warmup_batches(max_num_batched_tokens, max_model_len)
    compiled = precompile(lambda: _run_batches(model, batches, block_size, device))
    _run_batches(model, batches, block_size, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    logger.info("kernels warmed up for %d kinds of step in %.1f s (%d kernel variants compiled or loaded)",
                len(batches), time.perf_counter() - start, compiled)


def _time_gemv_rows(model: torch.nn.Module, l2_bytes: int) -> None:
    """Time the GEMV against cuBLAS at a few rows of each of the model's weight shapes not timed yet (its variants
    compiled together first), where the model's layers may take the GEMV and its weights fit in an L2 cache of
    `l2_bytes` (gemv_rows.py: as a burst reads them)."""
    kernels = getattr(model, "kernels", None)
    kernel = kernel_module("gemv")
    if kernel is None or (kernels is not None and not kernels.gemv):
        return
    weights = gemv_rows.linear_weights(model, GEMV_DTYPES)
    if not gemv_rows.fits_in_l2(weights, l2_bytes):
        logger.info("GEMV against cuBLAS at 2-8 rows not timed: the weights outgrow L2 (%d MB), the rule by weight "
                    "size decides", l2_bytes >> 20)
        return
    todo = gemv_rows.pending(weights)
    if not todo:
        return
    pdl = kernels is not None and pdl_for(todo[0][0], kernels)

    def gemv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return kernel.gemv(x, weight, pdl=pdl)

    start = time.perf_counter()
    precompile(lambda: gemv_rows.first_calls(todo, gemv))
    try:
        counts = gemv_rows.calibrate(todo, gemv)
    except RuntimeError as err:  # a capture the platform refuses: the steps keep the rule by element count
        logger.warning("GEMV against cuBLAS at 2-8 rows not timed (%s): the rule by weight size decides", err)
        return
    logger.info("GEMV against cuBLAS at 2-8 rows: %d (weight shape, rows) to the GEMV, %d to cuBLAS, %d ties (the "
                "rule by weight size), in %.1f s", counts["gemv"], counts["cublas"], counts["tie"],
                time.perf_counter() - start)


def _run_batches(model: torch.nn.Module, batches: list[Rows], block_size: int, device: torch.device) -> None:
    for rows in batches:
        metadata = null_block_metadata(rows, block_size, device)
        positions = torch.cat([torch.arange(s - q, s, device=device) for q, s in rows])
        input_ids = torch.zeros_like(positions)
        with set_attention_metadata(metadata):
            hidden = model(input_ids, positions)
        last_rows = torch.tensor(metadata.query_start_loc_cpu[1:], device=device) - 1
        logits = model.compute_logits(hidden[last_rows])
    warm_up_sampling(logits[:1])


def precompile(run: Callable[[], None], max_workers: int = 8) -> int:
    """Call `run` with every Triton kernel that is not compiled yet skipped (neither compiled nor
    launched: its output stays garbage), then compile all the skipped variants at once on a thread pool
    (Triton's AsyncCompileMode; variants in Triton's disk cache are only loaded). Returns how many
    variants there were; 0 without triton (then there is nothing to compile)."""
    try:
        from triton import AsyncCompileMode, knobs
    except ImportError:
        return 0

    missed: list[tuple[object, str]] = []

    def skip(*, fn: object, compile: dict, **_: object) -> bool:
        missed.append((fn.jit_function, compile["specialization_data"]))
        return True  # "handled": Triton returns without compiling or launching

    previous, knobs.runtime.jit_cache_hook = knobs.runtime.jit_cache_hook, skip
    try:
        run()
    finally:
        knobs.runtime.jit_cache_hook = previous
    with ThreadPoolExecutor(max_workers) as pool, AsyncCompileMode(pool):
        for jit_function, specialization in missed:
            jit_function.preload(specialization)
    return len({specialization for _, specialization in missed})


def warm_up_sampling(logits: torch.Tensor) -> None:
    """Compile the sampling kernel's two common variants: temperature only, and with top-p (top-k and
    min-p variants compile on first use). CUDA logits only: the kernel module imports triton."""
    from lamina.kernels import sampling

    ones = torch.ones(logits.shape[0], device=logits.device)
    keys = torch.zeros(logits.shape[0], dtype=torch.int64, device=logits.device)
    sampling.sample(logits, ones, keys)
    sampling.sample(logits, ones, keys, top_p=ones * 0.9)
