"""The paged decode kernel against torch_ref: q_len 1 and 1 + k (k = 3), tree masks, contexts cut into several
splits (empty splits and split boundaries inside the 1 + k verified tokens included), GQA 1/2/4."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (CI installs it with the test extra)")

from lamina.kernels.decode_attention import choose_num_splits, decode_attention  # noqa: E402
from tests.kernels.cases import Case, make_case, tolerance  # noqa: E402

# 1-token decodes and 4-token verifications; 33 with 3 splits of 16 keys puts a split boundary
# between the verified tokens (positions 29..32); 1 is a one-token context.
SEQ_LENS = [150, 33, 1, 67, 90]


def run_decode(case: Case, max_q: int, num_splits: int, block_n: int | None = 16) -> torch.Tensor:
    k_cache, v_cache = case.stored_caches()
    md = case.metadata
    out = torch.full_like(case.q, float("nan"))
    decode_attention(case.q, k_cache, v_cache, out, md.block_tables, md.seq_lens, md.query_start_loc,
                     max_q, case.scale, num_splits,
                     config={"BLOCK_N": block_n} if block_n else None)
    return out


@pytest.mark.parametrize("dtype,heads,kv_heads,head_dim,block_size,q_lens,num_splits", [
    (torch.float32, 4, 4, 64, 16, [1, 1, 1, 1, 1], 1),  # plain decode, one split: no reduce
    (torch.float32, 4, 2, 128, 16, [1, 4, 1, 4, 4], 3),  # 1 + k tokens, split boundary inside them
    (torch.bfloat16, 8, 2, 64, 4, [4, 4, 1, 4, 1], 7),  # GQA 4, pages of 4, empty splits
    (torch.bfloat16, 4, 1, 128, 16, [1, 1, 1, 4, 1], 4),  # MQA (4 heads share one KV head)
    (torch.float32, 2, 2, 80, 8, [4, 1, 1, 1, 4], 2),  # head_dim 80
])
def test_decode_matches_reference(dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int,
                                  block_size: int, q_lens: list[int], num_splits: int) -> None:
    lens = [max(n, q) for n, q in zip(SEQ_LENS, q_lens)]
    case = make_case(lens, q_lens, heads, kv_heads, head_dim, block_size, dtype, seed=num_splits)
    out = run_decode(case, max(q_lens), num_splits)
    assert out.dtype == dtype and not out.isnan().any()
    torch.testing.assert_close(out.float(), case.reference(), **tolerance(dtype))


def test_decode_hopper_tile_and_skips_prefill_sequences() -> None:
    """Default BLOCK_N; the 9-token sequence is the prefill kernel's and must be left untouched."""
    case = make_case([200, 70, 12], [1, 9, 4], 4, 2, 64, 16, torch.bfloat16, seed=5)
    out = run_decode(case, max_q=4, num_splits=2, block_n=None)
    rows = torch.ones(14, dtype=torch.bool)
    rows[1:10] = False
    assert not out[rows].isnan().any() and out[~rows].isnan().all()
    torch.testing.assert_close(out[rows].float(), case.reference()[rows], **tolerance(torch.bfloat16))


def test_choose_num_splits() -> None:
    assert choose_num_splits(max_seq_len=300, num_seqs=1, num_kv_heads=8) == 1  # short: never split
    assert choose_num_splits(max_seq_len=32768, num_seqs=1, num_kv_heads=8) == 64  # one long sequence
    assert choose_num_splits(max_seq_len=32768, num_seqs=64, num_kv_heads=8) == 1  # the grid is full
    assert choose_num_splits(max_seq_len=32768, num_seqs=16, num_kv_heads=8) == 4
    assert choose_num_splits(max_seq_len=4096, num_seqs=256, num_kv_heads=8) == 1


@pytest.mark.parametrize("dtype,num_splits", [(torch.float32, 1), (torch.bfloat16, 3)])
def test_decode_with_a_tree_mask_matches_reference(dtype: torch.dtype, num_splits: int) -> None:
    """Two tree verifications (root + 7 nodes: each node sees the keys up to the root and its ancestors) beside a
    decode and a chain verification (causal rows of the same TreeMask), against torch_ref under the same mask."""
    from lamina.attention.metadata import TreeMask
    from lamina.spec.draft_tree import DraftTree
    tree = DraftTree.of([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    q_lens, seq_lens = [8, 1, 4, 8], [150, 33, 67, 40]
    case = make_case(seq_lens, q_lens, 4, 2, 64, 16, dtype, seed=3)
    ctx, bits = [], []
    for n, q in zip(seq_lens, q_lens):
        ctx += range(n - q + 1, n + 1)
        bits += [0] * q
        if q == 8:  # the last 7 tokens are the tree's nodes, the one before them the root (key n - 8)
            ctx[-7:], bits[-7:] = [n - 7] * 7, [tree.ancestor_bits(i) for i in range(7)]
    causal = case.reference()
    case.metadata.tree_mask = TreeMask.of(ctx, bits, "cpu")
    want = case.reference()
    assert (want - causal).abs().amax() > 0.1  # the mask matters
    k_cache, v_cache = case.stored_caches()
    md, out = case.metadata, torch.full_like(case.q, float("nan"))
    decode_attention(case.q, k_cache, v_cache, out, md.block_tables, md.seq_lens, md.query_start_loc, 8,
                     case.scale, num_splits, config={"BLOCK_N": 16}, tree_mask=(md.tree_mask.ctx, md.tree_mask.bits))
    torch.testing.assert_close(out.float(), want, **tolerance(dtype))
