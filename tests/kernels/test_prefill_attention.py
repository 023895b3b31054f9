"""The varlen prefill kernel against torch_ref: fresh prompts, chunks over cached prefixes whose
length is not a multiple of the block size, tiles larger and smaller than a page, GQA 1/2/4."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (CI installs it with the test extra)")

from lamina.kernels.prefill_attention import prefill_attention  # noqa: E402
from tests.kernels.cases import Case, make_case, tolerance  # noqa: E402

# seq 0: whole prompt, odd length; 1: 11-token chunk after a 9-token prefix (mid-block);
# 2: 19-token chunk after 31 cached tokens; 3: a 5-token prompt (one partial tile)
SEQ_LENS, Q_LENS = [37, 20, 50, 5], [37, 11, 19, 5]


def run_prefill(case: Case, min_query_len: int = 1, block_m: int | None = None,
                block_n: int | None = None) -> torch.Tensor:
    config = {"BLOCK_M": block_m, "BLOCK_N": block_n} if block_m else None
    k_cache, v_cache = case.stored_caches()
    md = case.metadata
    out = torch.full_like(case.q, float("nan"))
    prefill_attention(case.q, k_cache, v_cache, out, md.block_tables, md.seq_lens, md.query_start_loc,
                      md.max_query_len, case.scale, min_query_len=min_query_len, config=config)
    return out


@pytest.mark.parametrize("dtype,heads,kv_heads,head_dim,block_size,block_m,block_n", [
    (torch.float32, 4, 4, 64, 4, 16, 16),  # MHA, pages smaller than a tile
    (torch.float32, 4, 2, 128, 16, 16, 32),  # GQA 2, a K/V tile spans two pages
    (torch.bfloat16, 4, 1, 64, 8, 32, 16),  # GQA 4 (MQA), query tile taller than the K/V tile
    (torch.bfloat16, 4, 2, 128, 16, None, None),  # the Hopper tile config
    (torch.float32, 2, 1, 80, 16, 16, 16),  # head_dim 80, padded to 128 in the tile
    (torch.float16, 4, 2, 96, 16, None, None),  # head_dim 96 in fp16
])
def test_prefill_matches_reference(dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int,
                                   block_size: int, block_m: int | None, block_n: int | None) -> None:
    case = make_case(SEQ_LENS, Q_LENS, heads, kv_heads, head_dim, block_size, dtype, seed=head_dim + heads)
    out = run_prefill(case, block_m=block_m, block_n=block_n)
    assert out.dtype == dtype and not out.isnan().any()  # every element written, no poison read
    torch.testing.assert_close(out.float(), case.reference(), **tolerance(dtype))


def test_prefill_leaves_short_sequences_to_the_decode_kernel() -> None:
    case = make_case([30, 9, 12], [30, 1, 4], 2, 1, 64, 4, seed=3)
    out = run_prefill(case, min_query_len=5, block_m=16, block_n=16)
    assert not out[:30].isnan().any() and out[30:].isnan().all()
    torch.testing.assert_close(out[:30], case.reference()[:30], **tolerance(torch.float32))
