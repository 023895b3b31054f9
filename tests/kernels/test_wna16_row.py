"""The bf16 W4A16 / W8A16 GEMV of 1..4 rows (lamina.kernels.wna16_row) against the torch reference, on CPU
tensors under the interpreter: the same operands and tolerance as tests/kernels/test_wna16.py (every element
written, ~2 ulps), split K (with runs of no tiles), masked K tails, and mutations that must fail. The interpreter runs
this kernel slowly (~0.3-0.5 s a call even at these shapes): keep the shapes tiny."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from lamina.kernels import wna16_row  # noqa: E402
from lamina.kernels.wna16_gemv import NAIVE_INT8_XOR  # noqa: E402
from lamina.kernels.wna16_row import WNA16RowConfig, default_config, takes, wna16_row_gemv  # noqa: E402
from lamina.quant.packing import pack_int32  # noqa: E402
from tests.kernels.test_wna16 import VARIANTS, _ids, assert_matches, make_operands, reference  # noqa: E402

pytestmark = pytest.mark.usefixtures("bf16_round_to_nearest", "nan_empty")
N = 5  # BLOCK_N 4: the second row block clamped; BLOCK_N 2: three blocks
TILES = WNA16RowConfig(4, block_kw=8)  # K = 64: one tile at 4 bits, 2 at 8


def run_row(o: dict, bias: bool = True, config: WNA16RowConfig | None = TILES, **overrides) -> torch.Tensor:
    args = dict(zero_point=o["zero"], group_size=o["group_size"]) | overrides
    return wna16_row_gemv(o["x"], pack_int32(o["q"], o["bits"]), o["scale"], args["zero_point"],
                          o["bias"] if bias else None, o["bits"], args["group_size"], config=config)


def counters(n: int, split: int, cfg: WNA16RowConfig) -> torch.Tensor:
    return wna16_row.workspace(torch.device("cpu"), n, split, -(-n // cfg.block_n))[1]


@pytest.mark.parametrize("variant", VARIANTS, ids=_ids)
def test_row_matches_reference(variant: tuple) -> None:
    """K = 64: with bias unsplit (int4 in one tile, int8 in 2), without it split 2 ways in tiles of one chunk."""
    o = make_operands(*variant, m=1, n=N, k=64, seed=1)
    assert_matches(run_row(o), reference(o))
    assert_matches(run_row(o, bias=False, config=WNA16RowConfig(2, block_kw=4, split=2)), reference(o, bias=False))


@pytest.mark.parametrize("bits,group_size,symmetric", [(4, 32, False), (8, None, True)])
@pytest.mark.parametrize("m", [2, 4])
def test_rows_share_each_weight_word(m: int, bits: int, group_size: int | None, symmetric: bool) -> None:
    """2 and 4 rows of x: every row's output as the reference's (each word unpacked once, multiplied into every
    row), unsplit with bias and split 2 ways without; rows read through a view (row stride 96 elements)."""
    o = make_operands(bits, group_size, symmetric, m=m, n=N, k=64, seed=10 + m)
    assert_matches(run_row(o), reference(o))
    wide = torch.zeros((m, 96), dtype=o["x"].dtype)
    wide[:, :64] = o["x"]
    strided = dict(o, x=wide[:, :64])
    assert_matches(run_row(strided, bias=False, config=WNA16RowConfig(2, block_kw=4, split=2)),
                   reference(o, bias=False))


@pytest.mark.parametrize("bits,group_size", [(4, 128), (8, 16)])
def test_row_groups_and_default_config(bits: int, group_size: int) -> None:
    """int4 g128 (the checkpoints'), int8 g16 (one chunk a group); the default config (128-word tiles: masked)."""
    o = make_operands(bits, group_size, False, m=1, n=N, k=256, seed=2)
    assert_matches(run_row(o, config=WNA16RowConfig(4, block_kw=16)), reference(o))
    assert_matches(run_row(o, config=None), reference(o))


@pytest.mark.parametrize("bits,k", [(4, 200), (8, 204)])
def test_row_k_tail(bits: int, k: int) -> None:
    """K = 25 words (int4) / 51 (int8), per channel, in 2 tiles of 16 / 32 words: the last tile and its last
    chunk partly masked, with and without prefetch, split 2 (the second run is the partial tile)."""
    o = make_operands(bits, None, False, m=1, n=N, k=k, seed=k)
    ref = reference(o)
    assert_matches(run_row(o, config=WNA16RowConfig(4, block_kw=4 * bits)), ref)
    assert_matches(run_row(o, config=WNA16RowConfig(2, block_kw=4 * bits, prefetch=False)), ref)
    assert_matches(run_row(o, config=WNA16RowConfig(4, block_kw=4 * bits, split=2)), ref)


def test_row_k_tail_inside_groups() -> None:
    """int4 g32, K = 96 (12 words) in 8-word tiles: the second tile half masked, at a group border."""
    o = make_operands(4, 32, False, m=1, n=N, k=96, seed=3)
    assert_matches(run_row(o, config=WNA16RowConfig(4, block_kw=8)), reference(o))
    assert_matches(run_row(o, config=WNA16RowConfig(4, block_kw=8, prefetch=False)), reference(o))


@pytest.mark.parametrize("bits", (4, 8))
@pytest.mark.parametrize("split", (1, 2, 3))
def test_row_split_k(bits: int, split: int) -> None:
    """K = 128 in 4 tiles (4 words at int4, 8 at int8): split 3 gives runs of 2, 2 and no tiles (the last
    program adds zeros); the last to arrive adds the partials and the bias; the counters end at zero."""
    o = make_operands(bits, 32, False, m=1, n=N, k=128, seed=split + bits)
    cfg = WNA16RowConfig(4, block_kw=bits, split=split)
    assert_matches(run_row(o, config=cfg), reference(o))
    if split > 1:
        assert not counters(N, split, cfg).any()
    if split == 3:
        assert_matches(run_row(o, bias=False, config=cfg), reference(o, bias=False))
        assert not counters(N, split, cfg).any()


def test_row_naive_int8_layout() -> None:
    for sym in (True, False):
        o = make_operands(8, 16, sym, m=1, n=N, k=64, seed=14)
        words = o["q"].contiguous().view(torch.int32)
        out = wna16_row_gemv(o["x"], words, o["scale"], o["zero"], o["bias"], 8, 16, xor=NAIVE_INT8_XOR,
                             config=TILES)
        assert_matches(out, reference(o))


@pytest.mark.parametrize("start", (16, 17))
def test_row_strided_x(start: int) -> None:
    """x one row of a wider [3, 160] tensor (x.stride(0) != K), 4-byte aligned or not (then copied)."""
    o = make_operands(4, 32, False, m=1, n=N, k=128, seed=7)
    wide = torch.zeros(3, 160, dtype=torch.bfloat16)
    wide[1, start:start + 128] = o["x"][0]
    o["x"] = wide[1:2, start:start + 128]
    assert o["x"].stride(0) == 160 and o["x"].stride(1) == 1
    assert_matches(run_row(o, config=WNA16RowConfig(4, block_kw=8)), reference(o))


@pytest.mark.parametrize("bits", (4, 8))
def test_row_mutations_fail(bits: int) -> None:
    """A zero point off in one group, the group size doubled, the zero points ignored, a split's partial
    dropped (the counter starting at 1: the first program to arrive thinks it is the last): each must fail."""
    o = make_operands(bits, 32, False, m=1, n=N, k=128, seed=15)
    ref = reference(o)
    assert_matches(run_row(o, config=WNA16RowConfig(4, block_kw=16)), ref)
    bumped = o["zero"].to(torch.int64)
    delta, lo = max(1, 1 << (bits - 4)), -(1 << (bits - 1))  # 8 bits: 1 is below the output's bf16 rounding
    bumped[3, 2] = (bumped[3, 2] - lo + delta) % (1 << bits) + lo
    for overrides in (dict(zero_point=bumped.to(torch.int8)), dict(group_size=64), dict(zero_point=None)):
        with pytest.raises(AssertionError):
            assert_matches(run_row(o, config=WNA16RowConfig(4, block_kw=16), **overrides), ref)
    cfg = WNA16RowConfig(4, block_kw=8, split=2)
    ws, cnt = wna16_row.workspace(torch.device("cpu"), N, 2, 2)
    ws.zero_()
    cnt.fill_(1)
    try:
        with pytest.raises(AssertionError):
            assert_matches(run_row(o, config=cfg), ref)
    finally:
        cnt.zero_()
    assert_matches(run_row(o, config=cfg), ref)


def test_default_config_splits_where_the_row_blocks_are_few() -> None:
    """132 SMs, Llama-3-8B: split 2 for o_proj and down (1,024 row blocks), 1 for the rest; cached."""
    shapes = [("qkv", 6144, 4096), ("o_proj", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336),
              ("lm_head", 128256, 4096)]
    for bits in (4, 8):
        cfgs = {name: default_config(n, k, bits, 132) for name, n, k in shapes}
        assert {name: c.split for name, c in cfgs.items()} == dict(qkv=1, o_proj=2, gate_up=1, down=2, lm_head=1)
        assert all(c.name == f"n4-w1-kw128-s{c.split}-pf" for c in cfgs.values())
        assert default_config(4096, 4096, bits, 132) is cfgs["o_proj"]
    assert default_config(64, 128, 4, 132).split == 1  # one tile
    with pytest.raises(AssertionError, match="power of two"):
        WNA16RowConfig(3)


def test_takes_and_rejects() -> None:
    bf16 = torch.bfloat16
    assert takes(bf16, 1, 4096, 4, 128) and takes(bf16, 1, 4096, 8, None) and takes(bf16, 1, 64, 8, 16)
    assert takes(bf16, 1, 200, 4, None) and takes(bf16, 1, 4, 8, None)
    assert takes(bf16, 4, 4096, 4, 128) and takes(bf16, 2, 4096, 8, None)
    assert not takes(torch.float16, 1, 4096, 4, 128) and not takes(bf16, 5, 4096, 4, 128)
    assert not takes(bf16, 1, 4096, 4, 16) and not takes(bf16, 1, 4096, 8, 8) and not takes(bf16, 1, 204, 4, None)
    assert not takes(bf16, 1, 0, 4, None)
    o = make_operands(4, 32, True, m=5, n=N, k=64)
    words = pack_int32(o["q"], 4)
    with pytest.raises(AssertionError, match="1..4 bf16 rows"):
        wna16_row_gemv(o["x"], words, o["scale"], None, None, 4, 32)
    with pytest.raises(AssertionError, match="1..4 bf16 rows"):
        wna16_row_gemv(o["x"][:1].half(), words, o["scale"].half(), None, None, 4, 32)
    with pytest.raises(AssertionError, match="groups of whole 4-word chunks"):
        wna16_row_gemv(o["x"][:1], words, o["scale"], None, None, 4, 16)
