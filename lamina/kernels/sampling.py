"""Sorting-free sampling: one Triton program per row, no sort, no host sync (FlashInfer's idea).

Row r samples from softmax(x), x = logits / T over the tokens that survive top-k, top-p and min-p
(`lamina.layers.sampler` defines them; its torch path is the oracle):

    keep(j) = l_j >= kth                    top-k (kth: the k-th largest logit, ties kept; -inf = off)
            & x_j >= m + log(min_p)         min-p (m = max x)
            & M(j) < top_p * Z              top-p: M(j) = sum of e^(x_i - m) over x_i > x_j,
                                                   Z = sum of e^(x_i - m) over l_i >= kth

Top-k and min-p are floors known after one pass. Top-p is a "top set": if j is out, so is every token
less likely than j. So the program samples by rejection (exact):

    pivot = -inf
    loop:  j = Gumbel-max over {keep-floors, x > pivot}     one pass: argmax(x + g), g ~ Gumbel(0, 1)
           accept if M(j) < top_p * Z                        one pass (skipped when top_p = 1)
           else pivot = x_j                                  j and all below it are out of the top-p set

The accepted j is distributed as softmax restricted to the kept set: each draw is from that
distribution restricted to a superset of it, and rejections only drop tokens outside it. The top token
is always accepted (M = 0), so the loop ends; with top_p 0.95 it almost always ends in the first round.
A row with no finite logit (Z = 0: all -inf, or NaN) has no top token to accept: the loop also ends when a
draw is not above the pivot, and such a row gets an arbitrary token instead of spinning the GPU forever.
Noise g = -log(-log(u)), u from Philox keyed by the row's seed, at a counter fixed by the round and the
column: a row's tokens depend only on its seed, never on the batch. A row with temperature 0 is greedy (argmax);
given each row's argmax (the CUDA graphs compute it with the logits: lamina/worker/cuda_graphs.py), such a row
copies it instead of reading its logits.

Importing this module imports triton: the sampler imports it only for CUDA logits.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_V = 4096  # vocabulary tile: 16 KB of float32 logits per load
NUM_WARPS = 8


@triton.jit
def _row_stats(row_ptr, scale, kth, vocab: tl.constexpr, BLOCK: tl.constexpr):
    """(m, Z): max of x over the row, and the sum of e^(x - m) over the top-k tokens (online)."""
    m_vec = tl.full([BLOCK], float("-inf"), tl.float32)
    s_vec = tl.zeros([BLOCK], tl.float32)
    for start in range(0, vocab, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        logit = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
        x = logit * scale
        m_new = tl.maximum(m_vec, x)
        alpha = tl.where(m_vec > float("-inf"), tl.exp(m_vec - m_new), 0.0)
        term = tl.where((logit >= kth) & (x > float("-inf")), tl.exp(x - m_new), 0.0)
        s_vec = s_vec * alpha + term
        m_vec = m_new
    m = tl.max(m_vec, 0)
    z = tl.sum(tl.where(m_vec > float("-inf"), s_vec * tl.exp(m_vec - m), 0.0), 0)
    return m, z


@triton.jit
def _lane_update(best, best_idx, row_ptr, cols, u, scale, kth, floor_x, pivot, noise, vocab: tl.constexpr):
    """Each lane keeps its best x + Gumbel noise among the kept tokens it has seen (the first on ties)."""
    logit = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
    x = logit * scale
    gumbel = -tl.log(-tl.log(tl.maximum(u, 2.3283064e-10)))  # u = 0 -> 2^-32: no -inf noise
    score = x + tl.where(noise, gumbel, 0.0)
    keep = (cols < vocab) & (logit >= kth) & (x >= floor_x) & (x > pivot)
    better = keep & (score > best)
    return tl.where(better, score, best), tl.where(better, cols, best_idx)


@triton.jit
def _gumbel_argmax(row_ptr, scale, kth, floor_x, pivot, seed, noise, round_idx, vocab: tl.constexpr,
                   BLOCK: tl.constexpr):
    """argmax over {l >= kth, x >= floor_x, x > pivot} of x + noise * Gumbel, the first index on ties.

    A tile is four quarters; one Philox call (rand4x) gives a uniform to each lane of every quarter, at
    counter (round_idx * tiles + tile) * QUARTER + lane. Lanes reduce once, after the last tile."""
    QUARTER: tl.constexpr = BLOCK // 4
    TILES: tl.constexpr = (vocab + BLOCK - 1) // BLOCK
    lanes = tl.arange(0, QUARTER)
    best = tl.full([QUARTER], float("-inf"), tl.float32)
    best_idx = tl.zeros([QUARTER], tl.int32)
    for tile in range(0, TILES):
        start = tile * BLOCK
        u0, u1, u2, u3 = tl.rand4x(seed, (round_idx * TILES + tile) * QUARTER + lanes)
        best, best_idx = _lane_update(best, best_idx, row_ptr, start + lanes, u0, scale, kth, floor_x, pivot,
                                      noise, vocab)
        best, best_idx = _lane_update(best, best_idx, row_ptr, start + QUARTER + lanes, u1, scale, kth, floor_x,
                                      pivot, noise, vocab)
        best, best_idx = _lane_update(best, best_idx, row_ptr, start + 2 * QUARTER + lanes, u2, scale, kth,
                                      floor_x, pivot, noise, vocab)
        best, best_idx = _lane_update(best, best_idx, row_ptr, start + 3 * QUARTER + lanes, u3, scale, kth,
                                      floor_x, pivot, noise, vocab)
    top = tl.max(best, 0)
    return tl.min(tl.where(best == top, best_idx, 2147483647), 0)


@triton.jit
def _mass_above(row_ptr, scale, x_j, m, vocab: tl.constexpr, BLOCK: tl.constexpr):
    """sum of e^(x_i - m) over x_i > x_j."""
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, vocab, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        logit = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
        x = logit * scale
        acc += tl.where(x > x_j, tl.exp(x - m), 0.0)
    return tl.sum(acc, 0)


@triton.jit
def _sample_row(row_ptr, temperature, top_p, log_min_p, kth, seed, vocab: tl.constexpr, BLOCK: tl.constexpr):
    """The token of one row (the module docstring's loop)."""
    noise = temperature > 0.0
    scale = 1.0 / tl.where(noise, temperature, 1.0)
    m = 0.0
    z = 1.0
    if (top_p < 1.0) | (log_min_p > float("-inf")):
        m, z = _row_stats(row_ptr, scale, kth, vocab, BLOCK)
    floor_x = m + log_min_p
    pivot = float("-inf")
    round_idx = 0
    j = _gumbel_argmax(row_ptr, scale, kth, floor_x, pivot, seed, noise, round_idx, vocab, BLOCK)
    if top_p < 1.0:
        x_j = tl.load(row_ptr + j).to(tl.float32) * scale
        rejected = _mass_above(row_ptr, scale, x_j, m, vocab, BLOCK) >= top_p * z
        # a draw not above the pivot means nothing was left to draw (a row of -inf or NaN logits): stop there
        while rejected & (x_j > pivot):
            pivot = x_j
            round_idx += 1
            j = _gumbel_argmax(row_ptr, scale, kth, floor_x, pivot, seed, noise, round_idx, vocab, BLOCK)
            x_j = tl.load(row_ptr + j).to(tl.float32) * scale
            rejected = _mass_above(row_ptr, scale, x_j, m, vocab, BLOCK) >= top_p * z
    return j.to(tl.int64)


@triton.jit
def _sample_kernel(logits_ptr, stride_row, temperature_ptr, top_p_ptr, min_p_ptr, kth_ptr, seed_ptr, argmax_ptr,
                   out_ptr, vocab: tl.constexpr, HAS_TOP_P: tl.constexpr, HAS_MIN_P: tl.constexpr,
                   HAS_KTH: tl.constexpr, HAS_ARGMAX: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    temperature = tl.load(temperature_ptr + row).to(tl.float32)  # float32 or float64 rows: the same value
    seed = tl.load(seed_ptr + row)
    top_p = 1.0
    if HAS_TOP_P:
        top_p = tl.load(top_p_ptr + row).to(tl.float32)
    log_min_p = float("-inf")
    if HAS_MIN_P:
        log_min_p = tl.log(tl.load(min_p_ptr + row).to(tl.float32))
    kth = float("-inf")
    if HAS_KTH:
        kth = tl.load(kth_ptr + row)
    if HAS_ARGMAX:  # a greedy row's token is its argmax, computed already: no pass over the vocabulary
        if temperature == 0.0:
            j = tl.load(argmax_ptr + row).to(tl.int64)
        else:
            j = _sample_row(row_ptr, temperature, top_p, log_min_p, kth, seed, vocab, BLOCK)
    else:
        j = _sample_row(row_ptr, temperature, top_p, log_min_p, kth, seed, vocab, BLOCK)
    tl.store(out_ptr + row, j)


def sample(logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor, top_p: torch.Tensor | None = None,
           min_p: torch.Tensor | None = None, kth: torch.Tensor | None = None, block_v: int = BLOCK_V, *,
           argmax: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row of logits [B, V] (any float dtype, unit stride along V) -> [B] int64 token ids.

    Per row, float32 or float64: temperature (0 = greedy), top_p (1 = off), min_p (0 = off); kth float32 (the
    k-th largest logit, ties kept; -inf = off); seeds int64 (the row's Philox key). None: no row uses that filter.
    `argmax` [B] int64: each row's argmax, computed already; greedy rows copy it instead of reading their logits.
    `out` [B] int64: where the tokens go (a new tensor if None). Nothing waits for the host or makes the host
    wait (a CUDA graph captures it)."""
    num_rows, vocab = logits.shape
    assert logits.stride(1) == 1
    if out is None:
        out = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    if num_rows == 0:
        return out
    _sample_kernel[(num_rows,)](
        logits, logits.stride(0), temperature, _or(top_p, temperature), _or(min_p, temperature),
        _or(kth, temperature), seeds, _or(argmax, seeds), out, vocab=vocab, HAS_TOP_P=top_p is not None,
        HAS_MIN_P=min_p is not None, HAS_KTH=kth is not None, HAS_ARGMAX=argmax is not None, BLOCK=block_v,
        num_warps=NUM_WARPS)
    return out


def _or(t: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
    """A pointer argument the kernel never reads when its HAS_* flag is off."""
    return placeholder if t is None else t
