"""The decode GEMV kernel against F.linear on CPU tensors, under the interpreter.

Shapes are small and deliberately not multiples of the blocks (masked K tails, clamped N rows, empty
K splits). Kernel outputs and the split-K workspace are allocated NaN-filled (`nan_empty`), so an
element or a partial a kernel forgets to write fails. bf16 casts round to nearest even as on the GPU
(`bf16_round_to_nearest`; the interpreter truncates otherwise). Both fixtures: tests/kernels/conftest.py.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from lamina.kernels import gemv as gemv_module  # noqa: E402
from lamina.kernels.gemv import (  # noqa: E402
    CANDIDATE_CONFIGS,
    MAX_M,
    GemvConfig,
    INTERPRETER_SMS,
    default_config,
    num_sms,
    gemv,
)
from lamina.config import KernelChoice  # noqa: E402
from lamina.layers import dispatch, linear  # noqa: E402
from lamina.layers.embedding import ParallelLMHead  # noqa: E402
from tests.kernels.cases import assert_close_elementwise  # noqa: E402

SMALL_CONFIGS = [
    GemvConfig(8, 64, 1, 4, 1),  # K loop with a masked tail tile
    GemvConfig(4, 32, 3, 2, 1),  # split K, uneven tile count per split
    min((c for c in CANDIDATE_CONFIGS if c.split_k == 1), key=lambda c: c.block_n * c.block_k),
    min((c for c in CANDIDATE_CONFIGS if c.split_k > 1), key=lambda c: c.block_n * c.block_k),
]
N, K = 21, 200  # neither a multiple of any block

pytestmark = pytest.mark.usefixtures("bf16_round_to_nearest", "nan_empty")


def _inputs(m: int, n: int, k: int, dtype: torch.dtype = torch.float32, seed: int = 0
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [m, k], weight [n, k] scaled so outputs are O(1), bias [n]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) / k ** 0.5
    b = torch.randn(n, generator=g)
    return x.to(dtype), w.to(dtype), b.to(dtype)


@pytest.mark.parametrize("config,m", [(c, m) for c in SMALL_CONFIGS[:2] for m in range(1, MAX_M + 1)]
                         + [(c, m) for c in SMALL_CONFIGS[2:] for m in (1, MAX_M)],
                         ids=lambda v: v.name if isinstance(v, GemvConfig) else f"m{v}")
def test_matches_linear(config: GemvConfig, m: int) -> None:
    x, w, b = _inputs(m, N, K)
    assert_close_elementwise(gemv(x, w, b, config), F.linear(x, w, b))
    assert_close_elementwise(gemv(x, w, None, config), F.linear(x, w))


@pytest.mark.parametrize("config", [None, SMALL_CONFIGS[-1]], ids=lambda c: "default" if c is None else c.name)
def test_a_row_does_not_depend_on_the_rows_beside_it(config: GemvConfig | None) -> None:
    """Each row of an M-row call equals that row computed alone, bit for bit (bf16, as a verify step's rows and a
    one-row decode step of the same positions compute them)."""
    x, w, b = _inputs(MAX_M, N, K, dtype=torch.bfloat16, seed=4)
    together = gemv(x, w, b, config)
    for m in range(MAX_M):
        assert torch.equal(together[m:m + 1], gemv(x[m:m + 1], w, b, config)), m


@pytest.mark.parametrize("n,k", [(5, 3), (1, 70), (33, 64)])
def test_default_config_and_edge_shapes(n: int, k: int) -> None:
    """No config (default_config), tiny N (all rows clamped), K < one tile, K a multiple of the tile."""
    x, w, b = _inputs(2, n, k, seed=1)
    assert_close_elementwise(gemv(x, w, b), F.linear(x, w, b))


def test_empty_splits_write_zeros() -> None:
    """split_k > number of K tiles: the extra splits own nothing and must add exactly zero."""
    x, w, b = _inputs(3, N, K, seed=2)
    assert_close_elementwise(gemv(x, w, b, GemvConfig(16, 128, 4, 4, 1)), F.linear(x, w, b))


@pytest.mark.parametrize("config", SMALL_CONFIGS[:2], ids=lambda c: c.name)
def test_strided_x(config: GemvConfig) -> None:
    """x a column slice of a wider buffer (row stride != K), as a view of a fused output would be."""
    buf = torch.randn(MAX_M, K + 29, generator=torch.Generator().manual_seed(3))
    x = buf[:3, 7:7 + K]
    assert x.stride(0) == K + 29 and not x.is_contiguous()
    _, w, b = _inputs(3, N, K)
    assert_close_elementwise(gemv(x, w, b, config), F.linear(x, w, b))
    torch.testing.assert_close(buf[:3, 7:7 + K], x, atol=0, rtol=0)


@pytest.mark.parametrize("config", [SMALL_CONFIGS[0], SMALL_CONFIGS[1]], ids=lambda c: c.name)
def test_bf16(config: GemvConfig) -> None:
    """bf16 in and out, fp32 inside: within about one bf16 ulp of F.linear (fp32 math, one rounding)."""
    x, w, b = _inputs(2, N, K, dtype=torch.bfloat16, seed=4)
    out = gemv(x, w, b, config)
    assert_close_elementwise(out, F.linear(x, w, b))
    exact = F.linear(x.float(), w.float(), b.float()).to(torch.bfloat16)
    assert (out.float() - exact.float()).abs().max() <= 2 ** -7 * exact.float().abs().max()


def test_inputs_untouched() -> None:
    x, w, b = _inputs(2, N, K, seed=5)
    before = (x.clone(), w.clone(), b.clone())
    gemv(x, w, b, SMALL_CONFIGS[1])
    for t, t0 in zip((x, w, b), before, strict=True):
        assert torch.equal(t, t0)


@pytest.mark.parametrize("case,match", [
    ("dtype", "dtype mismatch"),
    ("bias_dtype", "dtype mismatch"),
    ("too_many_rows", "MAX_M"),
    ("k_mismatch", "K mismatch"),
    ("noncontiguous_weight", "contiguous"),
    ("transposed_weight", "contiguous"),
    ("strided_k", "stride 1"),
    ("bias_shape", "bias must be"),
    ("x_1d", r"x must be \[M, K\]"),
])
def test_rejects_bad_inputs(case: str, match: str) -> None:
    x, w, b = _inputs(2, 8, 16)
    bad = {
        "dtype": lambda: gemv(x.to(torch.bfloat16), w),
        "bias_dtype": lambda: gemv(x, w, b.to(torch.bfloat16)),
        "too_many_rows": lambda: gemv(torch.randn(MAX_M + 1, 16), w),
        "k_mismatch": lambda: gemv(torch.randn(2, 17), w),
        "noncontiguous_weight": lambda: gemv(x, torch.randn(8, 32)[:, :16]),
        "transposed_weight": lambda: gemv(x, torch.randn(16, 8).t()),
        "strided_k": lambda: gemv(torch.randn(2, 32)[:, ::2], w),
        "bias_shape": lambda: gemv(x, w, torch.randn(9)),
        "x_1d": lambda: gemv(x[0], w),
    }[case]
    with pytest.raises(AssertionError, match=match):
        bad()


def test_configs() -> None:
    assert 12 <= len(CANDIDATE_CONFIGS) <= 24 and len(set(CANDIDATE_CONFIGS)) == len(CANDIDATE_CONFIGS)
    assert any(c.split_k > 1 for c in CANDIDATE_CONFIGS)
    with pytest.raises(AssertionError, match="power of two"):
        GemvConfig(3, 64)
    shapes = [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (6144, 4096), (4096, 4096),
              (28672, 4096), (4096, 14336), (151936, 1024), (128256, 4096)]
    for n, k in shapes:
        c = default_config(n, k)
        assert c.block_k <= 4096 and c.block_n * c.block_k <= 16384, (n, k, c)
        assert (n + c.block_n - 1) // c.block_n >= 132, f"{n}x{k}: fewer programs than SMs with {c}"


def test_default_config_follows_the_device_sm_count() -> None:
    """Fewer SMs need fewer programs for a full wave: wider tiles (the SM count comes from the device)."""
    assert default_config(1024, 1024, 132).block_n == 1
    assert default_config(1024, 1024, 16).block_n == 2
    assert num_sms(torch.device("cpu")) == INTERPRETER_SMS


# --- the layers' switch ------------------------------------------------------------------------------


def _route_cpu_to_gemv(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make dispatch treat CPU tensors as CUDA ones and take float32 too (rows <= GEMV_MAX_ROWS then go to the
    interpreted GEMV; every other condition of dispatch.gemv_for applies as on a GPU); returns the list of
    row counts the GEMV was called with."""
    calls: list[int] = []

    def counting_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                      pdl: bool = False) -> torch.Tensor:
        assert not pdl, "CPU tensors never launch with PDL"
        calls.append(x.shape[0])
        return gemv_module.gemv(x, weight, bias, pdl=pdl)

    monkeypatch.setattr(dispatch, "on_kernel_device", lambda x: True)
    monkeypatch.setattr(dispatch, "GEMV_DTYPES", (*dispatch.GEMV_DTYPES, torch.float32))
    monkeypatch.setattr(dispatch, "_gemv_module", lambda: SimpleNamespace(MAX_M=MAX_M, gemv=counting_gemv))
    return calls


def test_cpu_tensors_never_take_the_gemv() -> None:
    x, weight = torch.zeros(1, 8, dtype=torch.bfloat16), torch.zeros(4, 8, dtype=torch.bfloat16)
    assert dispatch.gemv_for(x, weight, KernelChoice()) is None


def test_decode_rows_of_linear_layers_and_lm_head_take_the_gemv(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _route_cpu_to_gemv(monkeypatch)
    gen = torch.Generator().manual_seed(3)
    qkv = linear.QKVParallelLinear(40, 8, 3, 1, bias=True)
    qkv.weight.data.copy_(torch.randn(qkv.weight.shape, generator=gen))
    qkv.bias.data.copy_(torch.randn(qkv.bias.shape, generator=gen))
    head = ParallelLMHead(50, 40)
    head.weight.data.copy_(torch.randn(head.weight.shape, generator=gen))
    for rows in (1, MAX_M, MAX_M + 1):  # small weights: the GEMV up to its MAX_M rows, then cuBLAS
        x = torch.randn(rows, 40, generator=gen)
        torch.testing.assert_close(qkv(x), F.linear(x, qkv.weight, qkv.bias), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(head.compute_logits(x), F.linear(x, head.weight), atol=1e-5, rtol=1e-5)
    assert calls == [1, 1, MAX_M, MAX_M]
    small = min(qkv.weight.numel(), head.weight.numel()) - 1
    monkeypatch.setattr(dispatch, "GEMV_ROW_ELEMENTS", small)  # one row of either weight is past it now
    limit = dispatch.GEMV_MAX_ROWS
    for rows in (limit, limit + 1):
        x = torch.randn(rows, 40, generator=gen)
        torch.testing.assert_close(qkv(x), F.linear(x, qkv.weight, qkv.bias), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(head.compute_logits(x), F.linear(x, head.weight), atol=1e-5, rtol=1e-5)
    assert calls == [1, 1, MAX_M, MAX_M, limit, limit]  # more rows of a large weight: cuBLAS
    off = KernelChoice(gemv=False)  # a model built with the GEMV off: cuBLAS at every batch size
    qkv_off = linear.QKVParallelLinear(40, 8, 3, 1, bias=True, kernels=off)
    head_off = ParallelLMHead(50, 40, kernels=off)
    qkv_off.load_state_dict(qkv.state_dict())
    head_off.load_state_dict(head.state_dict())
    x = torch.randn(1, 40, generator=gen)
    torch.testing.assert_close(qkv_off(x), F.linear(x, qkv.weight, qkv.bias), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(head_off.compute_logits(x), F.linear(x, head.weight), atol=1e-5, rtol=1e-5)
    assert calls == [1, 1, MAX_M, MAX_M, limit, limit]
