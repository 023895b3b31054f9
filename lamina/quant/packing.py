"""Packing of N-bit integers into int32 words, the compressed-tensors "pack-quantized" convention.

A value q in [-2^(b-1), 2^(b-1) - 1] is stored unsigned (q + 2^(b-1)); 32 / b consecutive values along the
packed dimension share one int32 word, the first in the lowest bits:

    word w of a row  =  sum_j (q[row, w * per_word + j] + offset) << (j * b),   per_word = 32 // b
    b = 4:  | v7 | v6 | v5 | v4 | v3 | v2 | v1 | v0 |   (bit 31 ... bit 0)

A row whose length is not a multiple of per_word is padded with q = -offset (stored bits 0).
Only b in (4, 8) is supported: the widths vLLM's WNA16 kernels and lamina's methods use.
"""
from __future__ import annotations

import torch

SUPPORTED_BITS = (4, 8)


def check_num_bits(num_bits: int, what: str = "num_bits") -> None:
    if num_bits not in SUPPORTED_BITS:
        raise ValueError(f"{what}: only {list(SUPPORTED_BITS)}-bit integers are supported, got {num_bits!r}")


def packed_size(size: int, num_bits: int) -> int:
    """How many int32 words hold `size` values of `num_bits` bits."""
    per_word = 32 // num_bits
    return -(-size // per_word)


def pack_int32(q: torch.Tensor, num_bits: int, dim: int = 1) -> torch.Tensor:
    """Signed int8 values [rows, cols] -> int32 words, packed along `dim` (1: columns, 0: rows)."""
    check_num_bits(num_bits)
    if dim == 0:
        return pack_int32(q.t(), num_bits, 1).t().contiguous()
    per_word = 32 // num_bits
    rows, cols = q.shape
    words = packed_size(cols, num_bits)
    unsigned = q.to(torch.int64) + (1 << (num_bits - 1))
    unsigned = torch.nn.functional.pad(unsigned, (0, words * per_word - cols))
    shifts = torch.arange(per_word, dtype=torch.int64, device=q.device) * num_bits
    packed = (unsigned.reshape(rows, words, per_word) << shifts).sum(dim=-1)  # < 2^32: no carries between fields
    return (packed - (packed >= 2 ** 31).to(torch.int64) * 2 ** 32).to(torch.int32)


def unpack_int32(packed: torch.Tensor, num_bits: int, size: int, dim: int = 1) -> torch.Tensor:
    """The inverse of `pack_int32`: int32 words -> signed int8 values, `size` of them along `dim`."""
    check_num_bits(num_bits)
    if dim == 0:
        return unpack_int32(packed.t(), num_bits, size, 1).t().contiguous()
    per_word = 32 // num_bits
    rows, words = packed.shape
    if words * per_word < size:
        raise ValueError(f"packed tensor of {words} int32 words per row cannot hold {size} {num_bits}-bit values")
    shifts = torch.arange(per_word, dtype=torch.int64, device=packed.device) * num_bits
    fields = (packed.to(torch.int64).unsqueeze(-1) >> shifts) & ((1 << num_bits) - 1)
    values = fields.reshape(rows, words * per_word)[:, :size] - (1 << (num_bits - 1))
    return values.to(torch.int8)
