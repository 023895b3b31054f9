"""The tensor-core W4A16 / W8A16 matmul (lamina.kernels.wna16_mma) against the torch reference, on CPU tensors
under the interpreter: the same operands and tolerance as tests/kernels/test_wna16.py (every element written,
~2 ulps), and mutations that must fail."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from lamina.kernels.wna16_gemv import NAIVE_INT8_XOR  # noqa: E402
from lamina.kernels.wna16_mma import WNA16MmaConfig, default_config, wna16_mma  # noqa: E402
from lamina.quant.packing import pack_int32  # noqa: E402
from tests.kernels.test_wna16 import N, VARIANTS, _ids, assert_matches, make_operands, reference  # noqa: E402

pytestmark = pytest.mark.usefixtures("bf16_round_to_nearest", "nan_empty")
SMALL = WNA16MmaConfig(16, 16, 32, 4, 1)  # one K step per group of 32


def run_mma(o: dict, bias: bool = True, config: WNA16MmaConfig | None = SMALL, **overrides) -> torch.Tensor:
    args = dict(zero_point=o["zero"], group_size=o["group_size"]) | overrides
    return wna16_mma(o["x"], pack_int32(o["q"], o["bits"]), o["scale"], args["zero_point"],
                     o["bias"] if bias else None, o["bits"], args["group_size"], config=config)


@pytest.mark.parametrize("variant", VARIANTS, ids=_ids)
@pytest.mark.parametrize("m", (1, 3, 20))
def test_mma_matches_reference(variant: tuple, m: int) -> None:
    """K = 256 in steps of 32 values; N = 21 (two row blocks, the second clamped); 20 rows: two M blocks."""
    o = make_operands(*variant, m=m, n=N, k=256, seed=m)
    assert_matches(run_mma(o, bias=m != 3), reference(o, bias=m != 3))


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
@pytest.mark.parametrize("bits", (4, 8))
def test_mma_dtypes_default_config_and_strided_x(dtype: torch.dtype, bits: int) -> None:
    o = make_operands(bits, 128, False, m=2, n=N, k=256, dtype=dtype, seed=7)
    wide = torch.zeros(2, 288, dtype=dtype)
    wide[:, 16:272] = o["x"]
    o["x"] = wide[:, 16:272]
    assert not o["x"].is_contiguous()
    assert_matches(run_mma(o, config=None), reference(o))


@pytest.mark.parametrize("bits", (4, 8))
def test_mma_k_tail(bits: int) -> None:
    """K = 208 in steps of 64: the last step masked (channel scales: any step divides the group)."""
    o = make_operands(bits, None, False, m=4, n=N, k=208, seed=9)
    assert_matches(run_mma(o, config=WNA16MmaConfig(16, 16, 64, 4, 1)), reference(o))


@pytest.mark.parametrize("bits", (4, 8))
@pytest.mark.parametrize("split", (3, 16))
def test_mma_split_k_matches_reference(bits: int, split: int) -> None:
    """K = 256 in 8 steps of 32 split 3 ways (3, 3, 2 steps) or 16 (one step each, half the splits empty: they must
    add zeros); 20 rows (two M blocks), with and without bias; the split sums reduced in fp32, one rounding."""
    o = make_operands(bits, 32, False, m=20, n=N, k=256, seed=split + bits)
    cfg = WNA16MmaConfig(16, 16, 32, 4, 1, split)
    assert_matches(run_mma(o, config=cfg), reference(o))
    assert_matches(run_mma(o, bias=False, config=cfg), reference(o, bias=False))


def test_mma_naive_int8_layout() -> None:
    for sym in (True, False):
        o = make_operands(8, 32, sym, m=2, n=N, k=128, seed=14)
        words = o["q"].contiguous().view(torch.int32)
        out = wna16_mma(o["x"], words, o["scale"], o["zero"], o["bias"], 8, 32, xor=NAIVE_INT8_XOR, config=SMALL)
        assert_matches(out, reference(o))


@pytest.mark.parametrize("bits", (4, 8))
def test_mma_mutations_fail(bits: int) -> None:
    """A zero point off in one group, the group size doubled, the zero points ignored: each must fail."""
    o = make_operands(bits, 32, False, m=3, n=N, k=256, seed=15)
    ref = reference(o)
    assert_matches(run_mma(o), ref)
    bumped = o["zero"].to(torch.int64)
    delta, lo = max(1, 1 << (bits - 4)), -(1 << (bits - 1))
    bumped[5, 3] = (bumped[5, 3] - lo + delta) % (1 << bits) + lo
    for overrides in (dict(zero_point=bumped.to(torch.int8)), dict(group_size=64), dict(zero_point=None)):
        with pytest.raises(AssertionError):
            assert_matches(run_mma(o, **overrides), ref)


def test_default_config_divides_groups_and_k() -> None:
    for m in (1, 4, 16, 17, 64, 2048):
        for k, gs in [(4096, 128), (14336, 128), (4096, None), (96, 32), (208, None)]:
            cfg = default_config(m, 4096, k, gs)
            assert (gs or 1 << 30) % cfg.block_k == 0 and k % cfg.block_k == 0 and cfg.block_k >= 16
            assert cfg.block_m >= 16 and cfg.block_n >= 16
            assert cfg.split_k == 1 or k // cfg.block_k // cfg.split_k >= 4  # each split walks 4 steps or more


def test_default_config_splits_k_where_the_row_blocks_are_few() -> None:
    """132 SMs: o_proj's 64 row blocks split 8 ways, down's 8 (K = 14,336: 112 steps), qkv's 96 blocks 5 ways;
    gate_up (448 blocks) and the LM head (2,004) are not split."""
    splits = {name: default_config(1, n, k, 128, 132).split_k
              for name, n, k in [("o_proj", 4096, 4096), ("down", 4096, 14336), ("qkv", 6144, 4096),
                                 ("gate_up", 28672, 4096), ("lm_head", 128256, 4096)]}
    assert splits == {"o_proj": 8, "down": 8, "qkv": 5, "gate_up": 1, "lm_head": 1}


def test_takes_multiples_of_16_only() -> None:
    from lamina.kernels.wna16_mma import takes

    assert takes(4096, 128) and takes(64, 16) and takes(4096, None)
    assert not takes(64, 8) and not takes(200, None) and not takes(96, 24)
    with pytest.raises(AssertionError, match="multiples of 16"):
        run_mma(make_operands(4, 8, True, m=2, n=N, k=64), config=None)
