"""Fused RMSNorm / RoPE / SiLU-and-mul kernels against the layers' PyTorch (CPU) path, under the interpreter.

The interpreter truncates float32 -> bfloat16 casts, where the GPU (cvt.rn) and PyTorch round to nearest
even; `bf16_round_to_nearest` makes it round like the GPU, so bf16 results can be compared tightly.
Kernel outputs are allocated NaN-filled (`nan_empty`), so an element a kernel forgets to write fails.
"""
from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

from lamina.config import KernelChoice  # noqa: E402
from lamina.kernels import fused_ops  # noqa: E402
from lamina.layers import dispatch  # noqa: E402
from lamina.layers.activation import SiluAndMul  # noqa: E402
from lamina.layers.norm import RMSNorm  # noqa: E402
from lamina.layers.rotary import RotaryEmbedding  # noqa: E402
from lamina.models import common  # noqa: E402
from tests.kernels.cases import assert_close_elementwise  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16]
MAX_POS = 32768
POSITIONS = [0, 1, 17, 4097, MAX_POS - 1]

pytestmark = pytest.mark.usefixtures("bf16_round_to_nearest", "nan_empty")


def _norm_layer(hidden: int, dtype: torch.dtype, seed: int = 0, kernels: KernelChoice = KernelChoice()) -> RMSNorm:
    layer = RMSNorm(hidden, eps=1e-6, kernels=kernels)
    layer.weight.data.copy_(1 + 0.3 * torch.randn(hidden, generator=torch.Generator().manual_seed(seed)))
    return layer.to(dtype)


def _randn(*shape: int, dtype: torch.dtype, seed: int = 1, scale: float = 2.0) -> torch.Tensor:
    return (scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [96, 1000])
def test_rms_norm(dtype: torch.dtype, hidden: int) -> None:
    layer, x = _norm_layer(hidden, dtype), _randn(3, hidden, dtype=dtype)
    assert_close_elementwise(fused_ops.rms_norm(x, layer.weight, 1e-6), layer(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [96, 1000])
def test_fused_add_rms_norm(dtype: torch.dtype, hidden: int) -> None:
    layer = _norm_layer(hidden, dtype)
    x, residual = _randn(3, hidden, dtype=dtype), _randn(3, hidden, dtype=dtype, seed=2)
    x_before, res_before = x.clone(), residual.clone()
    out, new_residual = fused_ops.fused_add_rms_norm(x, residual, layer.weight, 1e-6)
    ref_out, ref_residual = layer(x, residual)
    torch.testing.assert_close(new_residual, ref_residual, atol=0, rtol=0)  # the add rounds identically
    assert_close_elementwise(out, ref_out)
    assert torch.equal(x, x_before) and torch.equal(residual, res_before)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_over_strided_heads(dtype: torch.dtype) -> None:
    """q_norm / k_norm: [T, H, D] views of the fused qkv output, rows not contiguous."""
    qkv = _randn(2, 5 * 64, dtype=dtype)
    q = qkv[:, : 3 * 64].reshape(2, 3, 64)
    assert not q.is_contiguous()
    layer = _norm_layer(64, dtype)
    assert_close_elementwise(fused_ops.rms_norm(q, layer.weight, 1e-6), layer(q))


def _rope_case(dtype: torch.dtype, head_dim: int, num_q: int, num_kv: int, kernels: KernelChoice = KernelChoice()
               ) -> tuple[RotaryEmbedding, torch.Tensor, torch.Tensor]:
    """A padded qkv buffer [T, (q | k | v | pad)] and the positions."""
    rope = RotaryEmbedding(head_dim, 1e6, MAX_POS, kernels=kernels)
    qkv = _randn(len(POSITIONS), (num_q + 2 * num_kv) * head_dim + 8, dtype=dtype)
    return rope, qkv, torch.tensor(POSITIONS)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("num_q,num_kv", [(4, 2), (3, 1)])
def test_rotary_inplace(dtype: torch.dtype, head_dim: int, num_q: int, num_kv: int) -> None:
    rope, qkv, positions = _rope_case(dtype, head_dim, num_q, num_kv)
    q_size, kv_size = num_q * head_dim, num_kv * head_dim
    q, k = qkv[:, :q_size], qkv[:, q_size:q_size + kv_size]
    ref_q, ref_k = rope(positions, q.clone(), k.clone())
    before, cache_before = qkv.clone(), rope.cos_sin_cache.clone()
    fused_ops.rotary_inplace(q, k, rope.cos_sin_cache, positions, head_dim)
    torch.testing.assert_close(q, ref_q, atol=0, rtol=0)  # same fp32 ops, same roundings
    torch.testing.assert_close(k, ref_k, atol=0, rtol=0)
    assert torch.equal(qkv[:, q_size + kv_size:], before[:, q_size + kv_size:]), "v / padding touched"
    assert torch.equal(rope.cos_sin_cache, cache_before) and torch.equal(positions, torch.tensor(POSITIONS))


def test_rotary_inplace_on_3d_heads() -> None:
    rope = RotaryEmbedding(64, 1e4, MAX_POS)
    q, k = _randn(5, 2, 64, dtype=torch.float32), _randn(5, 1, 64, dtype=torch.float32, seed=2)
    positions = torch.tensor(POSITIONS)
    ref_q, ref_k = rope(positions, q.clone(), k.clone())
    fused_ops.rotary_inplace(q, k, rope.cos_sin_cache, positions, 64)
    torch.testing.assert_close((q, k), (ref_q, ref_k), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim,num_q,num_kv", [(64, 4, 2), (128, 3, 1)])
def test_qk_norm_rotary_inplace(dtype: torch.dtype, head_dim: int, num_q: int, num_kv: int) -> None:
    """Qwen3's prologue in one kernel = q_norm / k_norm per head, then RoPE (the layers, in that order)."""
    rope, qkv, positions = _rope_case(dtype, head_dim, num_q, num_kv)
    q_norm, k_norm = _norm_layer(head_dim, dtype, seed=5), _norm_layer(head_dim, dtype, seed=6)
    q_size, kv_size = num_q * head_dim, num_kv * head_dim
    q, k = qkv[:, :q_size], qkv[:, q_size:q_size + kv_size]
    t = len(POSITIONS)
    ref_q, ref_k = rope(positions, q_norm(q.reshape(t, num_q, head_dim)).reshape(t, -1),
                        k_norm(k.reshape(t, num_kv, head_dim)).reshape(t, -1))
    before = qkv.clone()
    fused_ops.qk_norm_rotary_inplace(q, k, q_norm.weight, k_norm.weight, 1e-6, rope.cos_sin_cache, positions,
                                     head_dim)
    assert_close_elementwise(q, ref_q)
    assert_close_elementwise(k, ref_k)
    assert torch.equal(qkv[:, q_size + kv_size:], before[:, q_size + kv_size:]), "v / padding touched"
    with pytest.raises(AssertionError, match="head_dim"):
        fused_ops.qk_norm_rotary_inplace(q, k, q_norm.weight[:8], k_norm.weight, 1e-6, rope.cos_sin_cache,
                                         positions, head_dim)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter", [96, 1000, 1500])
def test_silu_and_mul(dtype: torch.dtype, inter: int) -> None:
    x = _randn(3, 2 * inter, dtype=dtype, scale=4.0)  # reaches deep into silu's negative tail
    assert_close_elementwise(fused_ops.silu_and_mul(x), SiluAndMul()(x))


def test_silu_and_mul_keeps_leading_dims() -> None:
    x = _randn(2, 3, 2 * 40, dtype=torch.bfloat16)
    assert_close_elementwise(fused_ops.silu_and_mul(x), SiluAndMul()(x))


# --- the layers' switch ------------------------------------------------------------------------------


def _route_cpu_to_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make dispatch treat CPU tensors as CUDA ones, so the layers' fused branch runs the interpreted kernels
    (every other condition of lamina.layers.dispatch applies as on a GPU)."""
    monkeypatch.setattr(dispatch, "on_kernel_device", lambda x: True)


def _forbid_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("a fused kernel was called")

    for name in ("rms_norm", "fused_add_rms_norm", "rotary_inplace", "qk_norm_rotary_inplace", "silu_and_mul"):
        monkeypatch.setattr(fused_ops, name, boom)


def _run_layers(dtype: torch.dtype, kernels: KernelChoice = KernelChoice()) -> list[torch.Tensor]:
    """Every layer once, as the decoder calls them: norms (plain, + residual, per head), RoPE, SiLU."""
    layer, head_norm = _norm_layer(96, dtype, kernels=kernels), _norm_layer(64, dtype, seed=4, kernels=kernels)
    x, residual = _randn(5, 96, dtype=dtype), _randn(5, 96, dtype=dtype, seed=3)
    rope, qkv, positions = _rope_case(dtype, 64, 4, 2, kernels)
    heads = head_norm(qkv[:, :256].reshape(5, 4, 64))
    q, k = rope(positions, qkv[:, :256], qkv[:, 256:384])
    act = SiluAndMul(kernels)(_randn(5, 192, dtype=dtype))
    normed_q, normed_k = _qwen3_prologue(dtype, kernels)
    return [layer(x), *layer(x, residual), heads, q.clone(), k.clone(), act, normed_q, normed_k]


def _qwen3_prologue(dtype: torch.dtype, kernels: KernelChoice) -> tuple[torch.Tensor, torch.Tensor]:
    """DecoderAttention's q/k norm + RoPE as the model calls it (fused on CUDA)."""
    attention = SimpleNamespace(q_norm=_norm_layer(64, dtype, seed=7, kernels=kernels),
                                k_norm=_norm_layer(64, dtype, seed=8, kernels=kernels),
                                rotary_emb=RotaryEmbedding(64, 1e6, MAX_POS, kernels=kernels), head_dim=64,
                                kernels=kernels)
    attention._head_norm = partial(common.DecoderAttention._head_norm, attention)
    _, qkv, positions = _rope_case(dtype, 64, 4, 2)
    q, k = common.DecoderAttention._norm_and_rotate(attention, positions, qkv[:, :256], qkv[:, 256:384])
    return q.clone(), k.clone()


def test_cpu_path_does_not_call_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    assert dispatch.fused_ops_for(torch.zeros(2), KernelChoice()) is None
    _forbid_kernels(monkeypatch)
    _run_layers(torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layers_fused_branch_matches_reference(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    reference = _run_layers(dtype)
    _route_cpu_to_kernels(monkeypatch)
    for actual, expected in zip(_run_layers(dtype), reference, strict=True):
        assert_close_elementwise(actual, expected)


def test_fused_ops_off_forces_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    _route_cpu_to_kernels(monkeypatch)
    _forbid_kernels(monkeypatch)
    _run_layers(torch.bfloat16, KernelChoice(fused_ops=False))


def test_routed_layers_call_every_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The counterpart of the test above: with the kernels allowed, each layer really takes its kernel."""
    _route_cpu_to_kernels(monkeypatch)
    called: set[str] = set()
    names = ("rms_norm", "fused_add_rms_norm", "rotary_inplace", "qk_norm_rotary_inplace", "silu_and_mul")

    def recording(name: str, kernel: object) -> object:
        def run(*args: object, **kwargs: object) -> object:
            called.add(name)
            return kernel(*args, **kwargs)
        return run

    for name in names:
        monkeypatch.setattr(fused_ops, name, recording(name, getattr(fused_ops, name)))
    _run_layers(torch.float32)
    assert called == set(names)
