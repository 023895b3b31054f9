"""Kernel tests run the Triton kernels on CPU tensors through Triton's interpreter.

TRITON_INTERPRET must be set before `triton.jit` decorates anything (the decorator picks the
interpreter at decoration time), so it is set here, before any test module imports the kernels.
Each test module starts with `pytest.importorskip("triton")`: without triton it is skipped, with reason.
"""
from __future__ import annotations

import os

import pytest

os.environ["TRITON_INTERPRET"] = "1"


def _fix_interpreter_scalar_index() -> None:
    """triton 3.6's interpreter converts its shape-(1,) scalars with int(array), which numpy >= 2.4
    rejects, so any `range(lo, hi)` with runtime bounds fails. Same fix as triton-lang/triton#9172."""
    try:
        import numpy as np
        from triton.runtime import interpreter
    except ImportError:
        return
    try:
        int(np.zeros(1))
        return  # older numpy: nothing to fix
    except TypeError:
        pass
    original = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope) -> None:  # noqa: ANN001 - interpreter internals
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch_lang_tensor


def _fix_interpreter_bf16_dot() -> None:
    """The interpreter stores bfloat16 as uint16 bit patterns and its tl.dot multiplies those bits
    (triton-lang/triton#11584; upstream: bf16 is unsupported under the interpreter). Convert bf16
    operands to float32 first — what the tensor cores compute (exact products, fp32 accumulation)."""
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    original = interpreter.InterpreterBuilder.create_dot

    def to_fp32(x):  # noqa: ANN001, ANN202 - interpreter internals
        if x.dtype != tl.bfloat16:
            return x
        data = interpreter._convert_float(x.data, tl.bfloat16, tl.float32, None).view(np.float32)
        return interpreter.TensorHandle(data, tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):  # noqa: ANN001, ANN202
        return original(self, to_fp32(a), to_fp32(b), d, input_precision, max_num_imprecise_acc)

    interpreter.InterpreterBuilder.create_dot = create_dot


def _fix_interpreter_fp8_cast() -> None:
    """The interpreter's cast to float8e4nv rounds up by adding one to the 3-bit mantissa without carrying into
    the exponent (1.96 -> 1.0 instead of 2.0; 22 of 864 values of a random K tile), where the GPU (cvt.rn.satfinite)
    and PyTorch round to nearest even: cast through PyTorch instead, as the fp8 KV store needs."""
    try:
        import numpy as np
        import torch
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    original = interpreter.InterpreterBuilder.create_fp_to_fp

    def create_fp_to_fp(self, src, dst_type, rounding_mode):  # noqa: ANN001, ANN202 - interpreter internals
        if dst_type.scalar != tl.float8e4nv:
            return original(self, src, dst_type, rounding_mode)
        data = src.data if src.dtype.scalar == tl.float32 else (
            interpreter._convert_float(src.data, src.dtype.scalar, tl.float32, None).view(np.float32))
        values = torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32))
        return interpreter.TensorHandle(values.to(torch.float8_e4m3fn).view(torch.uint8).numpy(), dst_type.scalar)

    interpreter.InterpreterBuilder.create_fp_to_fp = create_fp_to_fp


_fix_interpreter_scalar_index()
_fix_interpreter_bf16_dot()
_fix_interpreter_fp8_cast()


def rounding_cast_impl(original):  # noqa: ANN001, ANN201 - interpreter internals
    """The interpreter's cast_impl, but float32 -> bfloat16 rounds to nearest even (the interpreter truncates,
    where the GPU (cvt.rn) and PyTorch round): bf16 kernel results can then be compared tightly."""
    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime import interpreter

    def cast_impl(self, src, dst_type):  # noqa: ANN001, ANN202 - interpreter internals
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            data = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32))
            bits = data.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            return interpreter.TensorHandle(bits, tl.bfloat16)
        return original(self, src, dst_type)

    return cast_impl


@pytest.fixture
def bf16_round_to_nearest(monkeypatch: pytest.MonkeyPatch) -> None:
    """float32 -> bfloat16 casts in the interpreter round like the GPU's (rounding_cast_impl)."""
    from triton.runtime import interpreter

    monkeypatch.setattr(interpreter.InterpreterBuilder, "cast_impl",
                        rounding_cast_impl(interpreter.InterpreterBuilder.cast_impl))


@pytest.fixture
def nan_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.empty / empty_like return NaN-filled float tensors: an element a kernel forgets to write fails."""
    import torch

    empty, empty_like = torch.empty, torch.empty_like

    def poison(t: torch.Tensor) -> torch.Tensor:
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: poison(empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: poison(empty_like(*a, **kw)))
