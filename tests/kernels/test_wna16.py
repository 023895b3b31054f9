"""The W4A16 / W8A16 GEMV and GEMM against the torch reference (lamina.quant.wna16.dequantize + matmul), on CPU
tensors under the interpreter.

Every variant: 4 / 8 bits, channel / group, symmetric / asymmetric, 1..4 rows (GEMV) and a GEMM size, bias or
none, N and K that are not multiples of any block (clamped rows, masked K tails), fp16 and bf16, the naive int8
layout. Outputs are allocated NaN-filled (`nan_empty`): an element a kernel forgets fails. Mutations (a wrong
zero point, a wrong group index, a missing zero point) must fail the same comparison: the tolerance is tight.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from lamina.kernels.wna16_gemm import WNA16GemmConfig, dequantize_weight, wna16_gemm, wna16_matmul  # noqa: E402
from lamina.kernels.wna16_gemv import (  # noqa: E402
    CANDIDATE_CONFIGS,
    MAX_M,
    NAIVE_INT8_XOR,
    WNA16GemvConfig,
    default_config,
    group_words,
    wna16_gemv,
)
from lamina.quant import wna16  # noqa: E402
from lamina.quant.packing import pack_int32  # noqa: E402
from lamina.quant.wna16 import dequantize  # noqa: E402

pytestmark = pytest.mark.usefixtures("bf16_round_to_nearest", "nan_empty")
N = 21  # not a power of two, nor a multiple of any BLOCK_N
VARIANTS = [(bits, gs, sym) for bits in (4, 8) for gs in (None, 32) for sym in (True, False)]


def _ids(v: tuple) -> str:
    bits, gs, sym = v
    return f"int{bits}-{'channel' if gs is None else f'g{gs}'}-{'sym' if sym else 'asym'}"


def make_operands(bits: int, group_size: int | None, symmetric: bool, m: int, n: int, k: int,
                  dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> dict:
    """q uniform over the whole num_bits range, positive scales, zero points anywhere in the range."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    groups = 1 if group_size is None else k // group_size
    q = torch.randint(lo, hi + 1, (n, k), generator=g).to(torch.int8)
    scale = ((torch.rand(n, groups, generator=g) + 0.5) * 2.0 / ((1 << bits) * k ** 0.5)).to(dtype)
    zero = None if symmetric else torch.randint(lo, hi + 1, (n, groups), generator=g).to(torch.int8)
    x = torch.randn(m, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype)
    return dict(q=q, scale=scale, zero=zero, x=x, bias=bias, bits=bits, group_size=group_size)


def reference(o: dict, bias: bool = True) -> torch.Tensor:
    """The oracle: the reference path's weight (dequantize in the scale's dtype), matmul in fp32, one rounding."""
    w = dequantize(o["q"], o["scale"], o["zero"]).float()
    return F.linear(o["x"].float(), w, o["bias"].float() if bias else None).to(o["x"].dtype)


def assert_matches(out: torch.Tensor, ref: torch.Tensor) -> None:
    """Every element written, each within ~2 ulps of the 16-bit dtype at the outputs' scale."""
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert not out.isnan().any(), "an element was not written"
    scale = ref.float().abs().max().item()
    torch.testing.assert_close(out.float(), ref.float(), atol=2 ** -7 * scale, rtol=0)


def run_gemv(o: dict, bias: bool = True, config: WNA16GemvConfig | None = None, **overrides) -> torch.Tensor:
    args = dict(zero_point=o["zero"], num_bits=o["bits"], group_size=o["group_size"]) | overrides
    return wna16_gemv(o["x"], pack_int32(o["q"], o["bits"]), o["scale"], args["zero_point"],
                      o["bias"] if bias else None, args["num_bits"], args["group_size"], config=config)


def run_gemm(o: dict, bias: bool = True, config: WNA16GemmConfig | None = None, **overrides) -> torch.Tensor:
    args = dict(zero_point=o["zero"], group_size=o["group_size"]) | overrides
    return wna16_gemm(o["x"], pack_int32(o["q"], o["bits"]), o["scale"], args["zero_point"],
                      o["bias"] if bias else None, o["bits"], args["group_size"], config=config)


@pytest.mark.parametrize("variant", VARIANTS, ids=_ids)
@pytest.mark.parametrize("m", range(1, MAX_M + 1))
def test_gemv_matches_reference(variant: tuple, m: int) -> None:
    """K = 256 walked in tiles of 8 words (int4: 4 tiles of 2 groups; int8: 8 tiles of one group)."""
    o = make_operands(*variant, m=m, n=N, k=256, seed=m)
    assert_matches(run_gemv(o, bias=m % 2 == 1, config=WNA16GemvConfig(4, 8, 1)), reference(o, bias=m % 2 == 1))


@pytest.mark.parametrize("variant", VARIANTS, ids=_ids)
def test_gemv_default_and_wide_tiles(variant: tuple) -> None:
    """3 rows: the default config, and one row per program in 32-word tiles (int8: two of them)."""
    o = make_operands(*variant, m=3, n=N, k=256, seed=5)
    assert_matches(run_gemv(o), reference(o))
    assert_matches(run_gemv(o, config=WNA16GemvConfig(1, 32, 2)), reference(o))


@pytest.mark.parametrize("bits", (4, 8))
@pytest.mark.parametrize("k,group_size", [(200, None), (96, 24), (120, 40)])
def test_gemv_k_tails_and_odd_groups(bits: int, k: int, group_size: int | None) -> None:
    """K not a multiple of the tile (masked tail words and values: at 4 bits K = 200 ends mid-word is not
    possible, 25 words; group 24 / 40 are 3 / 5 words at 4 bits: sub-groups of one word), default config too."""
    if group_size is not None and group_size % (32 // bits):
        pytest.skip("a group of part of a word")
    o = make_operands(bits, group_size, False, m=3, n=N, k=k, seed=k)
    assert_matches(run_gemv(o, config=WNA16GemvConfig(2, 16, 2)), reference(o))
    assert_matches(run_gemv(o, config=WNA16GemvConfig(1, 8, 1)), reference(o))
    assert_matches(run_gemv(o), reference(o))


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
def test_gemv_dtypes_and_strided_x(dtype: torch.dtype) -> None:
    o = make_operands(4, 32, False, m=2, n=N, k=128, dtype=dtype, seed=7)
    wide = torch.zeros(2, 160, dtype=dtype)
    wide[:, 16:144] = o["x"]
    o["x"] = wide[:, 16:144]
    assert not o["x"].is_contiguous()
    assert_matches(run_gemv(o), reference(o))


@pytest.mark.parametrize("variant", VARIANTS, ids=_ids)
def test_gemm_matches_reference(variant: tuple) -> None:
    """37 rows (two M tiles, the second partial), BLOCK_K 32 inside a group of 32 (scalar group index)."""
    o = make_operands(*variant, m=37, n=N, k=256, seed=11)
    config = WNA16GemmConfig(32, 16, 32, 2, 4, 1)
    assert_matches(run_gemm(o, config=config), reference(o))
    assert_matches(run_gemm(o, bias=False), reference(o, bias=False))


@pytest.mark.parametrize("bits", (4, 8))
def test_gemm_group_not_a_multiple_of_block_k(bits: int) -> None:
    """group 40 with BLOCK_K 16: groups change inside a K tile (per-element group index); K = 200 masks a tail."""
    o = make_operands(bits, 40, False, m=5, n=N, k=200, seed=12)
    assert_matches(run_gemm(o, config=WNA16GemmConfig(16, 16, 16, 1, 4, 1)), reference(o))
    o = make_operands(bits, None, True, m=5, n=N, k=200, seed=13)
    assert_matches(run_gemm(o), reference(o))


@pytest.mark.parametrize("variant", VARIANTS, ids=_ids)
def test_dequantize_weight_is_the_reference_weight(variant: tuple) -> None:
    """The dequantize pass (K = 200: masked tails) equals the reference's weight exactly; wna16_matmul
    (dequantize + matmul) and the GEMM kernel both match the reference."""
    bits, gs, sym = variant
    o = make_operands(bits, gs and 40, sym, m=6, n=N, k=200, seed=21)
    words = pack_int32(o["q"], bits)
    torch.testing.assert_close(dequantize_weight(words, o["scale"], o["zero"], 200, bits, o["group_size"]),
                               dequantize(o["q"], o["scale"], o["zero"]), atol=0, rtol=0)
    for matmul in (wna16_matmul, wna16_gemm):
        assert_matches(matmul(o["x"], words, o["scale"], o["zero"], o["bias"], bits, o["group_size"]), reference(o))


def test_naive_int8_layout() -> None:
    """A naive int8 weight [N, K] viewed as int32 words: the XOR turns two's complement into q + 128."""
    for sym in (True, False):
        o = make_operands(8, 32, sym, m=2, n=N, k=128, seed=14)
        words = o["q"].contiguous().view(torch.int32)
        out = wna16_gemv(o["x"], words, o["scale"], o["zero"], o["bias"], 8, 32, xor=NAIVE_INT8_XOR)
        assert_matches(out, reference(o))
        o["x"] = torch.randn(9, 128, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
        out = wna16_gemm(o["x"], words, o["scale"], o["zero"], o["bias"], 8, 32, xor=NAIVE_INT8_XOR)
        assert_matches(out, reference(o))
    assert NAIVE_INT8_XOR == wna16._NAIVE_INT8_XOR


@pytest.mark.parametrize("kernel", ("gemv", "gemv-tiles", "gemm"))
@pytest.mark.parametrize("bits", (4, 8))
def test_mutations_fail(kernel: str, bits: int) -> None:
    """A zero point off by one in one group, a wrong group index (group size doubled: the next group's scale),
    or the zero points ignored: each must fail the comparison the tests above pass."""
    o = make_operands(bits, 32, False, m=20 if kernel == "gemm" else 3, n=N, k=256, seed=15)
    tiles = WNA16GemvConfig(4, 8, 1)
    run = {"gemv": run_gemv, "gemm": run_gemm, "gemv-tiles": lambda o, **kw: run_gemv(o, config=tiles, **kw)}[kernel]
    ref = reference(o)
    assert_matches(run(o), ref)
    bumped = o["zero"].to(torch.int64)
    delta, lo = max(1, 1 << (bits - 4)), -(1 << (bits - 1))  # 8 bits: 1 is below the output's bf16 rounding
    bumped[5, 3] = (bumped[5, 3] - lo + delta) % (1 << bits) + lo
    bumped = bumped.to(torch.int8)
    mutations = [dict(zero_point=bumped), dict(group_size=64), dict(zero_point=None)]
    for overrides in mutations:
        with pytest.raises(AssertionError):
            assert_matches(run(o, **overrides), ref)


def test_configs() -> None:
    assert len(set(CANDIDATE_CONFIGS)) == len(CANDIDATE_CONFIGS)
    with pytest.raises(AssertionError, match="power of two"):
        WNA16GemvConfig(3, 64)
    for n, k in [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]:
        for bits in (4, 8):
            for m in range(1, MAX_M + 1):
                c = default_config(n, k, bits, 132, m)
                kw = k * bits // 32
                assert kw % c.block_kw == 0 and c.block_kw <= 1024, (n, k, bits, c)
                assert (n + c.block_n - 1) // c.block_n >= 132 * 4, (n, k, bits, c)
                assert c.block_n * c.block_kw // (32 * c.num_warps) <= (32 if m == 1 else 16), (m, c)  # no spills
            assert group_words(bits, 128, c.block_kw) == 4
    assert group_words(4, None, 64) == 4 and group_words(4, 24, 64) == 1 and group_words(4, 64, 2) == 2
    with pytest.raises(ValueError, match="multiple of 8"):
        group_words(4, 12, 64)


def test_rejects_bad_inputs() -> None:
    o = make_operands(4, 32, True, m=2, n=N, k=128)
    with pytest.raises(AssertionError, match="rows"):
        wna16_gemv(torch.zeros(5, 128, dtype=torch.bfloat16), pack_int32(o["q"], 4), o["scale"], None, None, 4, 32)
    with pytest.raises(AssertionError, match="K mismatch"):
        wna16_gemv(o["x"], pack_int32(o["q"], 8), o["scale"], None, None, 4, 32)
    with pytest.raises(AssertionError, match="x's dtype"):
        wna16_gemm(o["x"], pack_int32(o["q"], 4), o["scale"].float(), None, None, 4, 32)
