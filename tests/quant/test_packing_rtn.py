"""Packing against compressed-tensors' own helpers, and what round-to-nearest guarantees."""
from __future__ import annotations

import pytest
import torch

from lamina.quant.config import WeightQuantArgs
from lamina.quant.packing import pack_int32, unpack_int32
from lamina.quant.rtn import int_range, rtn_quantize


@pytest.mark.parametrize("num_bits", [4, 8])
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("shape", [(5, 37), (16, 128), (3, 8)])
def test_packing_is_compressed_tensors_packing(num_bits, dim, shape):
    helpers = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")
    lo, hi = int_range(num_bits)
    q = torch.randint(lo, hi + 1, shape, dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    packed = pack_int32(q, num_bits, dim)
    assert torch.equal(packed, helpers.pack_to_int32(q, num_bits, packed_dim=dim))
    assert torch.equal(unpack_int32(packed, num_bits, shape[dim], dim), q)


def test_unsupported_widths_are_refused():
    with pytest.raises(ValueError, match=r"only \[4, 8\]-bit"):
        pack_int32(torch.zeros(2, 8, dtype=torch.int8), 3)


@pytest.mark.parametrize("args", [
    WeightQuantArgs(num_bits=8, symmetric=True, strategy="channel"),
    WeightQuantArgs(num_bits=4, symmetric=False, strategy="group", group_size=32),
    WeightQuantArgs(num_bits=4, symmetric=True, strategy="group", group_size=64),
])
def test_rtn_error_is_at_most_half_a_step(args):
    w = torch.randn(48, 128, generator=torch.Generator().manual_seed(1)) * 0.05
    w[3] = 0.0  # an all-zero row stays exactly zero
    w[4] = w[4].abs()  # all positive: zero is still representable
    packed = rtn_quantize(w, args, torch.float32)
    lo, hi = int_range(args.num_bits)
    assert int(packed.q.min()) >= lo and int(packed.q.max()) <= hi
    step = packed.scale.repeat_interleave(128 // packed.scale.shape[1], dim=1)
    error = (packed.dequantize() - w).abs()
    assert bool((error <= step / 2 + 1e-7).all())
    assert bool((packed.dequantize()[3] == 0).all())
    assert (packed.zero_point is None) == args.symmetric


def test_scales_are_stored_in_the_weight_dtype_and_used_as_stored():
    w = torch.randn(8, 128, dtype=torch.bfloat16)
    args = WeightQuantArgs(num_bits=4, symmetric=False, strategy="group", group_size=64)
    packed = rtn_quantize(w, args, torch.bfloat16)
    assert packed.scale.dtype == torch.bfloat16
    assert (packed.dequantize() - w.float()).abs().max() <= packed.scale.float().max() * 0.51


def test_group_size_must_divide_the_input():
    with pytest.raises(ValueError, match="input size 100 is not a multiple of weights.group_size 64"):
        rtn_quantize(torch.randn(4, 100), WeightQuantArgs(4, False, "group", 64), torch.float32)
