"""lamina.kernels.token_quant against the torch path it replaces (lamina.quant.w8a8's references), under the
interpreter: the same scales, the same int8 integers (ties round half to even), the same fp8 values, at K
below, equal to and above one tile; and the W8A8 layers route to it on CUDA (dispatch patched)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from lamina.kernels import token_quant  # noqa: E402
from lamina.layers import dispatch  # noqa: E402
from lamina.quant import w8a8  # noqa: E402

CASES = [(3, 40), (2, 4096), (1, 4096 + 37), (5, 1)]


def _x(rows: int, k: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * torch.rand(rows, 1, generator=g) * 8
    if k > 3:
        x[0, 3] = 200.0  # an outlier token column: the row's scale follows it
    return x.to(dtype)


@pytest.mark.parametrize("rows, k", CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_int8_equals_the_torch_path(rows: int, k: int, dtype: torch.dtype) -> None:
    x = _x(rows, k, dtype)
    q, s = token_quant.per_token_quant(x, torch.int8, w8a8.INT8_MAX, w8a8._MIN_SCALE)
    q_ref, s_ref = w8a8.per_token_int8_reference(x)
    torch.testing.assert_close(s, s_ref, rtol=0, atol=0)
    assert q.dtype == torch.int8 and torch.equal(q, q_ref)
    assert int(q.abs().amax(dim=-1).min()) == 127  # each row's max maps to the top of the range


def test_int8_ties_round_half_to_even() -> None:
    """x / s lands on k + 0.5 exactly (s = 1): 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -2.5 -> -2 (torch.round)."""
    x = torch.tensor([[0.5, 1.5, 2.5, -2.5, 3.5, 127.0]])
    q, _ = token_quant.per_token_quant(x, torch.int8, 127.0, 1e-12)
    assert q.tolist() == [[0, 2, 2, -2, 4, 127]]


@pytest.fixture
def fp8_round_to_nearest(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter's float32 -> fp8 e4m3 cast does not round to nearest even as the GPU (cvt.rn.satfinite)
    and torch do: make it round like them, so the kernel's values can be compared exactly."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_fp_to_fp

    def create_fp_to_fp(self, src, dst_type, rounding_mode):  # noqa: ANN001, ANN202 - interpreter internals
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.float8e4nv:
            data = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32))
            return interpreter.TensorHandle(data.to(w8a8.FP8_DTYPE).view(torch.uint8).numpy(), tl.float8e4nv)
        return original(self, src, dst_type, rounding_mode)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_fp_to_fp", create_fp_to_fp)


@pytest.mark.usefixtures("fp8_round_to_nearest")
@pytest.mark.parametrize("rows, k", CASES)
def test_fp8_equals_the_torch_path(rows: int, k: int) -> None:
    x = _x(rows, k, torch.bfloat16, seed=1)
    q, s = token_quant.per_token_quant(x, w8a8.FP8_DTYPE, w8a8.FP8_MAX, w8a8._MIN_SCALE)
    q_ref, s_ref = w8a8.per_token_fp8_reference(x)
    torch.testing.assert_close(s, s_ref, rtol=0, atol=0)
    assert q.dtype == w8a8.FP8_DTYPE and torch.equal(q.float(), q_ref.float())


def test_zero_rows_and_an_all_zero_token() -> None:
    q, s = token_quant.per_token_quant(torch.zeros(0, 8), torch.int8, 127.0, 1e-12)
    assert q.shape == (0, 8) and s.shape == (0, 1)
    q, s = token_quant.per_token_quant(torch.zeros(2, 8), torch.int8, 127.0, 1e-12)
    assert not q.any() and torch.equal(s, torch.full((2, 1), 1e-12))


@pytest.mark.usefixtures("fp8_round_to_nearest")
def test_the_w8a8_functions_route_to_the_kernel_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    original = token_quant.per_token_quant
    monkeypatch.setattr(dispatch, "on_kernel_device", lambda x: True)
    monkeypatch.setattr(token_quant, "per_token_quant", lambda *a: calls.append(a[1]) or original(*a))
    x = _x(4, 64, torch.bfloat16)
    assert torch.equal(w8a8.per_token_int8(x)[0], w8a8.per_token_int8_reference(x)[0])
    assert torch.equal(w8a8.per_token_fp8(x)[0].float(), w8a8.per_token_fp8_reference(x)[0].float())
    assert calls == [torch.int8, w8a8.FP8_DTYPE]
    assert dispatch.token_quant_for(x.t()) is None  # rows not contiguous: the torch path
