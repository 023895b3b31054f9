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


@pytest.mark.parametrize("cuda,capability,expected", [("13.0", (9, 0), True), ("12.4", (10, 0), True),
                                                      ("12.2", (9, 0), False), ("13.0", (8, 9), False),
                                                      (None, (9, 0), False)])
def test_devices_from_hopper_on_with_cuda_12_3(monkeypatch: pytest.MonkeyPatch, cuda: str | None,
                                              capability: tuple[int, int], expected: bool) -> None:
    """Hopper (sm_90) and later have griddepcontrol; CUDA graphs capture the programmatic edge from CUDA 12.3."""
    monkeypatch.setattr(pdl.torch.version, "cuda", cuda)
    monkeypatch.setattr(pdl.torch.cuda, "get_device_capability", lambda index: capability)
    pdl._device_supports.cache_clear()
    try:
        assert pdl._device_supports(0) is expected
    finally:
        pdl._device_supports.cache_clear()
