"""lamina.layers.dispatch: every condition under which a layer takes a Triton kernel, and that the CPU
path never imports triton. CPU tensors stand in for CUDA ones (`on_kernel_device` replaced) and a marker
object for the kernel modules, so no kernel runs here (tests/kernels/ run them under the interpreter)."""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from lamina.config import KernelChoice
from lamina.layers import dispatch
from lamina.layers.norm import RMSNorm

ON, OFF = KernelChoice(), KernelChoice(fused_ops=False, gemv=False)
FUSED = SimpleNamespace(name="fused_ops")
GEMV = SimpleNamespace(name="gemv", MAX_M=4)
BF16 = torch.bfloat16


@pytest.fixture()
def routed(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU tensors count as CUDA ones; the kernel modules 'import' as markers."""
    monkeypatch.setattr(dispatch, "on_kernel_device", lambda x: True)
    monkeypatch.setattr(dispatch, "_fused_ops_module", lambda: FUSED)
    monkeypatch.setattr(dispatch, "_gemv_module", lambda: GEMV)


def _zeros(*shape: int, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.zeros(*shape, dtype=dtype)


def test_cpu_tensors_take_no_kernel() -> None:
    x = _zeros(2, 8)
    assert dispatch.fused_ops_for(x, ON) is None
    assert dispatch.rms_norm_ops(x, _zeros(8), x, ON) is None
    assert dispatch.gemv_for(x, _zeros(4, 8), ON) is None


def test_kernel_choice_validates() -> None:
    with pytest.raises(ValueError, match="gemv: must be a bool"):
        KernelChoice(gemv=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pdl: must be a bool"):
        KernelChoice(pdl="yes")  # type: ignore[arg-type]


@pytest.mark.usefixtures("routed")
def test_pdl_needs_the_choice_and_a_cuda_device_that_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Programmatic dependent launch: only CUDA tensors (never the interpreter's CPU ones, even routed to the
    kernels: its gdc calls are GPU instructions), only where the device supports it, only when the choice allows."""
    assert not dispatch.pdl_for(_zeros(1, 8), ON)  # a CPU tensor, though routed to the kernels
    supports = {"answer": True}
    monkeypatch.setattr(dispatch, "_pdl_module", lambda: SimpleNamespace(supported=lambda x: supports["answer"]))
    cuda_x = SimpleNamespace(is_cuda=True)
    assert dispatch.pdl_for(cuda_x, ON)  # type: ignore[arg-type]
    assert not dispatch.pdl_for(cuda_x, KernelChoice(pdl=False))  # type: ignore[arg-type]
    supports["answer"] = False  # a GPU before sm_90
    assert not dispatch.pdl_for(cuda_x, ON)  # type: ignore[arg-type]


@pytest.mark.usefixtures("routed")
def test_fused_ops_follow_the_choice_and_dtype() -> None:
    assert dispatch.fused_ops_for(_zeros(2, 8), ON) is FUSED
    assert dispatch.fused_ops_for(_zeros(2, 8, dtype=torch.float32), ON) is FUSED
    assert dispatch.fused_ops_for(_zeros(2, 8), OFF) is None
    assert dispatch.fused_ops_for(_zeros(2, 8, dtype=torch.float64), ON) is None
    assert dispatch.silu_and_mul_ops(_zeros(2, 8), ON) is FUSED
    assert dispatch.silu_and_mul_ops(_zeros(2, 8), OFF) is None


@pytest.mark.usefixtures("routed")
def test_rms_norm_conditions() -> None:
    x, weight = _zeros(3, 8), _zeros(8)
    assert dispatch.rms_norm_ops(x, weight, None, ON) is FUSED
    assert dispatch.rms_norm_ops(x, weight, _zeros(3, 8), ON) is FUSED
    assert dispatch.rms_norm_ops(x, weight, None, OFF) is None
    assert dispatch.rms_norm_ops(x, weight.float(), None, ON) is None  # weight dtype != x dtype
    assert dispatch.rms_norm_ops(x, weight, _zeros(3, 8, dtype=torch.float32), ON) is None
    assert dispatch.rms_norm_ops(x, weight, _zeros(1, 8), ON) is None  # residual shape != x shape
    wide = dispatch.MAX_FUSED_HIDDEN + 1
    assert dispatch.rms_norm_ops(_zeros(1, wide), _zeros(wide), None, ON) is None


@pytest.mark.usefixtures("routed")
def test_rotary_and_qk_norm_conditions() -> None:
    q, k = _zeros(2, 16), _zeros(2, 8)
    assert dispatch.rotary_ops(q, k, ON) is FUSED
    assert dispatch.rotary_ops(q, k.float(), ON) is None
    assert dispatch.rotary_ops(q, k, OFF) is None
    q_norm, k_norm = RMSNorm(8, 1e-6).to(BF16), RMSNorm(8, 1e-6).to(BF16)
    assert dispatch.qk_norm_rotary_ops(q, q_norm, k_norm, ON) is FUSED
    assert dispatch.qk_norm_rotary_ops(q, q_norm, k_norm, OFF) is None
    assert dispatch.qk_norm_rotary_ops(q, q_norm, RMSNorm(8, 1e-5).to(BF16), ON) is None  # two epsilons
    assert dispatch.qk_norm_rotary_ops(q, q_norm, RMSNorm(8, 1e-6), ON) is None  # an fp32 weight


@pytest.mark.usefixtures("routed")
def test_gemv_conditions(monkeypatch: pytest.MonkeyPatch) -> None:
    weight, large = _zeros(6, 8), _zeros(7, 8)  # 48 and 56 elements
    monkeypatch.setattr(dispatch, "GEMV_ROW_ELEMENTS", 48 * GEMV.MAX_M)  # `weight`: every row count the kernel
    for rows in (1, GEMV.MAX_M):  # takes; `large`: up to 3 rows (3 x 56 <= 4 x 48 < 4 x 56), then cuBLAS
        assert dispatch.gemv_for(_zeros(rows, 8), weight, ON) is GEMV
    assert dispatch.gemv_for(_zeros(GEMV.MAX_M + 1, 8), weight, ON) is None
    assert dispatch.gemv_for(_zeros(3, 8), large, ON) is GEMV
    assert dispatch.gemv_for(_zeros(4, 8), large, ON) is None
    assert dispatch.gemv_for(_zeros(1, 3, 8), large, ON) is GEMV  # rows counted over the leading dims
    assert dispatch.gemv_for(_zeros(1, 4, 8), large, ON) is None
    assert dispatch.gemv_for(_zeros(0, 8), weight, ON) is None
    assert dispatch.gemv_for(_zeros(1, 8), weight, KernelChoice(gemv=False)) is None
    assert dispatch.gemv_for(_zeros(1, 8), weight, KernelChoice(fused_ops=False)) is GEMV  # independent switches
    assert dispatch.gemv_for(_zeros(1, 8, dtype=torch.float32), weight.float(), ON) is None  # 16-bit only
    assert dispatch.gemv_for(_zeros(1, 8), weight.half(), ON) is None  # weight dtype != x dtype
    assert dispatch.gemv_for(_zeros(1, 6), _zeros(8, 6).t(), ON) is None  # a transposed (strided) weight


def test_gemv_rows_shrink_as_the_weight_grows(monkeypatch: pytest.MonkeyPatch) -> None:
    """rows x elements within GEMV_ROW_ELEMENTS, GEMV_MAX_ROWS (measured: one row of any weight) at least."""
    monkeypatch.setattr(dispatch, "GEMV_ROW_ELEMENTS", 1 << 23)
    rows = {numel: dispatch.gemv_max_rows(torch.empty(numel, 1, device="meta"), 8)
            for numel in (384 * 2048, 1 << 21, 1024 * 3072, 1 << 22, 6144 * 1024, 151936 * 1024)}
    assert list(rows.values()) == [8, 4, 2, 2, 1, 1]  # demo gate_up; Qwen3-0.6B o_proj, down, qkv, gate_up, head
    assert dispatch.gemv_max_rows(torch.empty(1, 1, device="meta"), 4) == 4  # the kernel's own limit
    monkeypatch.setattr(dispatch, "GEMV_MAX_ROWS", 2)
    assert dispatch.gemv_max_rows(torch.empty(151936, 1024, device="meta"), 8) == 2


def test_the_cpu_path_never_imports_triton() -> None:
    """Building and running a model's layers on CPU tensors with triton unimportable."""
    code = ("import sys; sys.modules['triton'] = None\n"
            "import torch\n"
            "from lamina.layers.norm import RMSNorm\n"
            "from lamina.layers.linear import RowParallelLinear\n"
            "import lamina.models.common, lamina.loader.model_loader\n"
            "x = torch.ones(2, 8)\n"
            "RMSNorm(8)(x, x); RowParallelLinear(8, 4)(x)\n"
            "assert not any(name.startswith('lamina.kernels.') for name in sys.modules), sorted(sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
