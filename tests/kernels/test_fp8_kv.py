"""An fp8 (e4m3) KV cache in the Triton kernels against the torch reference: the store writes the reference's
bytes, both attention kernels read e4m3 * per-head scale, under the interpreter."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (CI installs it with the test extra)")

from lamina.attention import torch_ref  # noqa: E402
from lamina.attention.backends import get_attention_backend  # noqa: E402
from lamina.kernels.store_kv import store_kv  # noqa: E402
from tests.kernels.cases import make_case, tolerance  # noqa: E402

FP8 = torch.float8_e4m3fn


def _bytes(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.uint8)


def test_store_writes_the_references_e4m3_bytes() -> None:
    """Per-head scales, values past 448 * scale clamped, padding rows skipped, other slots untouched."""
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(9, 3, 32, generator=gen) * 4, torch.randn(9, 3, 32, generator=gen)
    k[0, 1, :4] = 1e4  # clamps to 448 * scale
    scales = (torch.tensor([0.5, 4.0, 1.0]), torch.tensor([0.01, 1.0, 2.0]))
    slots = torch.randperm(24, generator=gen)[:9]
    slots[3] = -1
    poison = torch.full((6, 4, 3, 32), float("nan")).to(FP8)
    expected_k, expected_v, k_cache, v_cache = (poison.clone() for _ in range(4))
    torch_ref.store_kv(k, v, expected_k, expected_v, slots, scales)
    store_kv(k, v, k_cache, v_cache, slots, scales)
    assert torch.equal(_bytes(k_cache), _bytes(expected_k)) and torch.equal(_bytes(v_cache), _bytes(expected_v))
    flat = k_cache.view(-1, 3, 32).float()
    assert (flat[slots[0], 1, :4] == 448.0).all()
    written = torch.zeros(24, dtype=torch.bool)
    written[slots[slots >= 0]] = True
    assert flat[written].isfinite().all() and flat[~written].isnan().all()  # -1 rows and other slots untouched


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_kernels_read_e4m3_times_the_head_scale(dtype: torch.dtype) -> None:
    """A prompt, a chunk over a cached prefix, a decode, a 1 + 3 verification and a long split decode over an fp8
    cache with a scale per KV head: the kernels equal attention over the dequantized cache."""
    seq_lens, q_lens = [23, 25, 40, 30, 1100], [23, 12, 1, 4, 1]
    case = make_case(seq_lens, q_lens, 4, 2, 64, 16, dtype, seed=3)
    scales = (torch.tensor([0.25, 3.0]), torch.tensor([2.0, 0.5]))
    k_cache, v_cache = case.k_cache.to(FP8), case.v_cache.to(FP8)  # the prefix (NaN elsewhere) in e4m3
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    out = get_attention_backend("triton").forward(case.q, case.k, case.v, k_cache, v_cache, case.metadata,
                                                  case.scale, scales)
    torch_ref.store_kv(case.k, case.v, ref_k, ref_v, case.metadata.slot_mapping, scales)
    assert torch.equal(_bytes(k_cache), _bytes(ref_k)) and torch.equal(_bytes(v_cache), _bytes(ref_v))
    dequantized = [torch_ref.dequantize(c, s).nan_to_num(0.0) for c, s in ((ref_k, scales[0]), (ref_v, scales[1]))]
    expected = torch_ref.paged_attention(case.q.float(), *dequantized, case.metadata, case.scale)
    assert out.dtype == dtype and not out.isnan().any()
    torch.testing.assert_close(out.float(), expected, **tolerance(dtype))
    # the scales matter: the same bytes read with scale 1 give another answer
    unscaled = torch_ref.paged_attention(case.q.float(), ref_k.float().nan_to_num(0.0),
                                         ref_v.float().nan_to_num(0.0), case.metadata, case.scale)
    assert (out.float() - unscaled).abs().max() > 0.1


def test_decode_over_fp8_clamps_bf16_queries_into_fp16s_range() -> None:
    """Over an fp8 cache the decode kernel's dots run in fp16 (decode_config's F16_DOT): a bf16 query beyond
    fp16's 65504 is clamped into range instead of becoming inf (and the output NaN)."""
    case = make_case([40, 70], [1, 1], 4, 2, 64, 16, torch.bfloat16, seed=5)
    q = case.q * 4e4  # |q| up to ~1.6e5
    assert q.abs().max() > 65504
    k_cache, v_cache = case.k_cache.to(FP8), case.v_cache.to(FP8)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    ones = (torch.ones(2), torch.ones(2))
    scale = 1e-6  # scores of order one: the softmax is not one-hot
    out = get_attention_backend("triton").forward(q, case.k, case.v, k_cache, v_cache, case.metadata, scale, ones)
    torch_ref.store_kv(case.k, case.v, ref_k, ref_v, case.metadata.slot_mapping, ones)
    expected = torch_ref.paged_attention(q.float().clamp(-65504, 65504), ref_k.float().nan_to_num(0.0),
                                         ref_v.float().nan_to_num(0.0), case.metadata, scale)
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), expected, **tolerance(torch.bfloat16))
