"""lamina.kernels.pdl: programmatic dependent launch is a compiled-kernel feature. Under the interpreter (this
directory's conftest turns it on) no tensor, not even a CUDA one, gets it; the kernels' own PTX order is checked in
test_kernels_compile_for_hopper.py."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("triton", reason="triton is not installed (CI installs it with the test extra)")

from lamina.kernels import pdl  # noqa: E402


def test_interpreted_kernels_never_launch_with_pdl() -> None:
    assert isinstance(pdl.wait, pdl.InterpretedFunction)  # the conftest's TRITON_INTERPRET=1 took
    assert not pdl.supported(SimpleNamespace(is_cuda=True))  # type: ignore[arg-type]
    assert not pdl.supported(SimpleNamespace(is_cuda=False))  # type: ignore[arg-type]
