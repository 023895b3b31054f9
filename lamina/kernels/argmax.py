"""Greedy sampling's argmax over the vocabulary, in two short passes of many programs.

torch.argmax(logits, dim=-1) on CUDA reduces a row in one thread block: at one row of a 128k-token vocabulary one
block walks 0.5 MB of float32 logits (27 us on the H200: ~1 % of a batch-1 step of an 8B model, ~3 % of a
0.6B's, on the critical path of every greedy step). Here the row is cut into chunks of BLOCK columns:

    logits [B, V]         pass 1, grid (B, C), C = cdiv(V, BLOCK): program (b, c) stores the largest of its
    |c=0|c=1| ... |c=C-1|   BLOCK logits and the first column holding it           ->  best [B, C], col [B, C]
                          pass 2, grid (B,): the first chunk with the row's largest best wins; its column is the
                          row's argmax                                             ->  out [B] int64

Ties go to the smaller column in both passes (tl.max's left tie-break; masked columns past V read -inf and lie to
the right of every real one), so a row's result is torch.argmax's: its first maximum. NaN counts as +inf (torch's
argmax returns a NaN's column; here the first NaN or +inf of the row). The torch reference is `reference`.
Importing this module imports triton (lamina.layers.sampler imports it for CUDA logits only).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048  # columns a pass-1 program reduces: 8 KB of float32 logits, ~75 programs a row at a 150k vocabulary
NUM_WARPS = 4


@triton.jit
def _chunk_max_kernel(x_ptr, best_ptr, col_ptr, V, stride_b, C, BLOCK: tl.constexpr):
    """best[b, c], col[b, c] = the largest logit of chunk c of row b (NaN as +inf) and its first column."""
    b = tl.program_id(0)
    c = tl.program_id(1)
    cols = c * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + b.to(tl.int64) * stride_b + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
    x = tl.where(x != x, float("inf"), x)
    best, i = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(best_ptr + b * C + c, best)
    tl.store(col_ptr + b * C + c, c * BLOCK + i)


@triton.jit
def _pick_kernel(best_ptr, col_ptr, out_ptr, C, BLOCK_C: tl.constexpr):
    """out[b] = col[b, j] of the first chunk j holding row b's largest best."""
    b = tl.program_id(0)
    offs = tl.arange(0, BLOCK_C)
    best = tl.load(best_ptr + b * C + offs, mask=offs < C, other=float("-inf"))
    _, j = tl.max(best, axis=0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(out_ptr + b, tl.load(col_ptr + b * C + j).to(tl.int64))


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """logits [B, V] (float32 / bf16 / fp16, last stride 1) -> [B] int64, each row's first largest column (NaN as
    +inf): torch.argmax(logits, dim=-1) in two passes of many programs."""
    assert logits.dim() == 2 and logits.shape[1] >= 1, f"logits must be [B, V >= 1], got {tuple(logits.shape)}"
    assert logits.stride(1) == 1, "logits' last dim must be contiguous"
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    chunks = triton.cdiv(vocab, BLOCK)
    best = torch.empty((rows, chunks), dtype=torch.float32, device=logits.device)
    col = torch.empty((rows, chunks), dtype=torch.int32, device=logits.device)
    _chunk_max_kernel[(rows, chunks)](logits, best, col, vocab, logits.stride(0), chunks, BLOCK=BLOCK,
                                      num_warps=NUM_WARPS)
    _pick_kernel[(rows,)](best, col, out, chunks, BLOCK_C=triton.next_power_of_2(chunks), num_warps=1)
    return out


def reference(logits: torch.Tensor) -> torch.Tensor:
    """The oracle: torch.argmax with NaN as +inf."""
    return torch.where(logits.isnan(), float("inf"), logits.float()).argmax(dim=-1)
