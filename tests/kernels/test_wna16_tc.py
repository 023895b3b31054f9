"""The tensor-core W4A16 / W8A16 GEMV of 1..16 rows (lamina.kernels.wna16_tc) against the torch reference, on CPU
tensors under the interpreter, where lamina.kernels.wna16_frags computes the MMAs' sums with tensor ops over the
lane dimensions (the index arithmetic of loads, fragments, scales, zero points, split K and stores is the
kernel's own; the inline assembly runs on the GPU: scripts/wna16_gemv_variants.py checks every config there).
Same operands and tolerance as tests/kernels/test_wna16.py. Keep the shapes tiny: ~0.1-0.3 s a call."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from lamina.kernels import wna16_row  # noqa: E402
from lamina.kernels.wna16_gemv import NAIVE_INT8_XOR  # noqa: E402
from lamina.kernels.wna16_tc import MAX_M, WNA16TCConfig, default_config, takes, wna16_tc_gemv  # noqa: E402
from lamina.quant.packing import pack_int32  # noqa: E402
from tests.kernels.test_wna16 import assert_matches, make_operands, reference  # noqa: E402

pytestmark = pytest.mark.usefixtures("bf16_round_to_nearest", "nan_empty")
N = 40  # 2 tiles of 16 rows and half of a third: rows past N clamped for the loads, masked at the store


def run_tc(o: dict, config: WNA16TCConfig | None, bias: bool = True) -> torch.Tensor:
    return wna16_tc_gemv(o["x"], pack_int32(o["q"], o["bits"]), o["scale"], o["zero"], o["bias"] if bias else None,
                         o["bits"], o["group_size"], config=config)


@pytest.mark.parametrize("bits,group_size,symmetric", [(4, 128, False), (4, 128, True), (4, None, False),
                                                       (8, None, True), (8, 64, False)])
@pytest.mark.parametrize("m", [1, 3, 8, 12])
def test_tc_matches_reference(bits: int, group_size: int | None, symmetric: bool, m: int) -> None:
    """Groups of one chunk (int4 g128, int8 g64) and per channel, with and without zero points, 1 / 3 / 8 / 12 rows
    of x (12: the second block of 8 rows, partly masked), K two chunks: every output as the reference's in two
    steps of one chunk (2 tiles a program), split 2 ways (the bias in the last program's sum), and in one step of
    two chunks without prefetch or bias."""
    o = make_operands(bits, group_size, symmetric, m=m, n=N, k=2 * 32 // bits * 16, seed=bits * 10 + m)
    assert_matches(run_tc(o, WNA16TCConfig(2, 1)), reference(o))
    assert_matches(run_tc(o, WNA16TCConfig(1, 1, split=2)), reference(o))
    assert_matches(run_tc(o, WNA16TCConfig(1, 2, prefetch=False), bias=False), reference(o, bias=False))


@pytest.mark.parametrize("split", [2, 3])
def test_tc_split_k_runs_and_counters(split: int) -> None:
    """int4 g128, K = 384 (3 steps), 2 and 16 rows of x: split 2 gives runs of 2 and 1 steps, split 3 of one each;
    the counters end at zero (the last program of each row block resets its own)."""
    for m in (2, 16):  # one block of x's rows, two (both blocks' partials summed by one arrival)
        o = make_operands(4, 128, False, m=m, n=N, k=384, seed=split + m)
        cfg = WNA16TCConfig(2, 1, split=split)
        assert_matches(run_tc(o, cfg), reference(o))
        assert not wna16_row.workspace(torch.device("cpu"), m * N, split, -(-N // 32))[1].any()


def test_tc_naive_int8_rows_through_a_view() -> None:
    """A naive int8 weight (signed bytes viewed as int32 words, wna16_gemv.NAIVE_INT8_XOR) and x's rows read
    through a view (row stride 96 values): as the reference."""
    o = make_operands(8, 64, False, m=2, n=N, k=64, seed=7)
    wide = torch.zeros((2, 96), dtype=o["x"].dtype)
    wide[:, :64] = o["x"]
    out = wna16_tc_gemv(wide[:, :64], o["q"].contiguous().view(torch.int32), o["scale"], o["zero"], o["bias"], 8,
                        64, xor=NAIVE_INT8_XOR, config=WNA16TCConfig(1, 1))
    assert_matches(out, reference(o))


def test_tc_default_config() -> None:
    o = make_operands(4, 128, True, m=1, n=N, k=256, seed=3)
    assert_matches(run_tc(o, None), reference(o))
    # the H200's 132 SMs: K split until ~10 programs a SM, each at least 2 steps of 2 chunks
    assert default_config(6144, 512, 132) == WNA16TCConfig(2, 2, split=7)
    assert default_config(128256, 512, 132) == WNA16TCConfig(2, 2, split=1)


def test_takes() -> None:
    assert takes(torch.bfloat16, MAX_M, 128, 4, 128) and takes(torch.bfloat16, 1, 64, 8, None)
    assert MAX_M == 16 and not takes(torch.bfloat16, MAX_M + 1, 128, 4, 128)  # two blocks of the MMA's 8 columns
    assert not takes(torch.float16, 1, 128, 4, 128)  # x read as bf16 pairs
    assert not takes(torch.bfloat16, 1, 192, 4, None)  # K not whole 128-value chunks at 4 bits
    assert not takes(torch.bfloat16, 1, 256, 4, 64)  # a group of half a chunk
    assert not takes(torch.bfloat16, 1, 256, 2, None)  # 2-bit weights


def test_tc_rejects_what_it_does_not_take() -> None:
    o = make_operands(4, 32, False, m=1, n=N, k=128, seed=4)
    with pytest.raises(AssertionError, match="whole chunks"):
        run_tc(o, None)
