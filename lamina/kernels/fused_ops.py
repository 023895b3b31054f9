"""Fused elementwise kernels of the decoder layer: residual add + RMSNorm, RoPE, SiLU-and-mul.

Each replaces a chain of small PyTorch launches (upcast, reduce, downcast, scale, ...) with one kernel,
and reproduces the PyTorch layers' rounding steps (lamina/layers/{norm,rotary,activation}.py):

    fused_add_rms_norm   r = x + res (model dtype);  out = w * (r_f32 * rsqrt(mean(r_f32^2) + eps)).to(dtype)
                         grid (rows, heads): one program per row of `hidden` (BLOCK = next pow2, masked)
    rotary_inplace       neox rotate-half in fp32 on q [T, Hq*D] and k [T, Hk*D], in place
                         grid (T, Hq + Hk): program (t, h) rotates head h of q (h < Hq) or of k
    qk_norm_rotary_inplace   per-head RMSNorm (q_norm / k_norm weights, Qwen3) then the rotation above,
                         in place, one launch instead of three; same grid
    silu_and_mul         x [T, 2I] -> silu(x[:, :I]).to(dtype) * x[:, I:]   (fp32 math, two roundings)
                         grid (T, cdiv(I, BLOCK))

Every launcher takes `pdl`: launch with programmatic dependent launch (lamina.kernels.pdl; the layers ask
lamina.layers.dispatch.pdl_for). Importing this module imports triton; the layers import it only on their first
CUDA call.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from lamina.kernels import pdl


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, new_res_ptr,
                     stride_x0, stride_x1, stride_r0, stride_r1, hidden, eps,
                     HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.launch_dependents(PDL)
    i0 = tl.program_id(0).to(tl.int64)
    i1 = tl.program_id(1).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    dtype = out_ptr.dtype.element_ty
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)  # a weight: read before the wait
    pdl.wait(PDL)
    x = tl.load(x_ptr + i0 * stride_x0 + i1 * stride_x1 + cols, mask=mask, other=0.0)
    row = (i0 * tl.num_programs(1) + i1) * hidden  # outputs are contiguous [rows, heads, hidden]
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + i0 * stride_r0 + i1 * stride_r1 + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)  # the add rounds to the model dtype
        tl.store(new_res_ptr + row + cols, x, mask=mask)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / hidden
    normed = (xf * tl.math.rsqrt(var + eps)).to(dtype)
    tl.store(out_ptr + row + cols, (w.to(tl.float32) * normed.to(tl.float32)).to(dtype), mask=mask)


@triton.jit
def _rotate_head(ptr, cos, sin, offs, mask, half):
    x1 = tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr + half + offs, mask=mask, other=0.0).to(tl.float32)
    dtype = ptr.dtype.element_ty
    tl.store(ptr + offs, (x1 * cos - x2 * sin).to(dtype), mask=mask)
    tl.store(ptr + half + offs, (x2 * cos + x1 * sin).to(dtype), mask=mask)


@triton.jit
def _rotary_kernel(q_ptr, k_ptr, cache_ptr, pos_ptr,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_cache,
                   num_q_heads, half, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.launch_dependents(PDL)
    pdl.wait(PDL)
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    mask = offs < half
    pos = tl.load(pos_ptr + token).to(tl.int64)
    cos = tl.load(cache_ptr + pos * stride_cache + offs, mask=mask, other=0.0)
    sin = tl.load(cache_ptr + pos * stride_cache + half + offs, mask=mask, other=0.0)
    if head < num_q_heads:
        _rotate_head(q_ptr + token * stride_qt + head * stride_qh, cos, sin, offs, mask, half)
    else:
        _rotate_head(k_ptr + token * stride_kt + (head - num_q_heads) * stride_kh, cos, sin, offs, mask, half)


@triton.jit
def _qk_norm_rotary_kernel(q_ptr, k_ptr, q_weight_ptr, k_weight_ptr, cache_ptr, pos_ptr,
                           stride_qt, stride_qh, stride_kt, stride_kh, stride_cache,
                           num_q_heads, half, eps, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.launch_dependents(PDL)
    pdl.wait(PDL)
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    mask = offs < half
    if head < num_q_heads:
        ptr = q_ptr + token * stride_qt + head * stride_qh
        w_ptr = q_weight_ptr
    else:
        ptr = k_ptr + token * stride_kt + (head - num_q_heads) * stride_kh
        w_ptr = k_weight_ptr
    dtype = q_ptr.dtype.element_ty
    x1 = tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr + half + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.math.rsqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / (2 * half) + eps)
    w1 = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    w2 = tl.load(w_ptr + half + offs, mask=mask, other=0.0).to(tl.float32)
    # RMSNorm's roundings (normed -> dtype, weight * normed -> dtype), then RoPE's in fp32
    y1 = (w1 * (x1 * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    y2 = (w2 * (x2 * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    cos = tl.load(cache_ptr + pos * stride_cache + offs, mask=mask, other=0.0)
    sin = tl.load(cache_ptr + pos * stride_cache + half + offs, mask=mask, other=0.0)
    tl.store(ptr + offs, (y1 * cos - y2 * sin).to(dtype), mask=mask)
    tl.store(ptr + half + offs, (y2 * cos + y1 * sin).to(dtype), mask=mask)


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_xt, inter, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.launch_dependents(PDL)
    pdl.wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(x_ptr + row * stride_xt + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_xt + inter + cols, mask=mask, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)  # F.silu rounds, then the mul
    tl.store(out_ptr + row * inter + cols, (silu * up).to(dtype), mask=mask)


def _num_warps(block: int) -> int:
    return 1 if block <= 256 else (4 if block <= 2048 else (8 if block <= 8192 else 16))


def _rows(t: torch.Tensor, hidden: int) -> torch.Tensor:
    """t as [rows, heads, hidden] with a unit last stride, a view when possible ([T, H, D] views of a
    fused qkv output keep their strides)."""
    if t.dim() == 3 and t.stride(2) == 1:
        return t
    if t.dim() == 2 and t.stride(1) == 1:
        return t[:, None, :]
    return t.reshape(-1, hidden).contiguous()[:, None, :]


def _launch_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float, pdl: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    hidden = x.shape[-1]
    assert weight.shape == (hidden,) and weight.dtype == x.dtype, "weight must be [hidden] in x's dtype"
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    new_res = None if residual is None else torch.empty_like(out)
    if x.numel() == 0:
        return out, new_res
    x3 = _rows(x, hidden)
    r3 = x3 if residual is None else _rows(residual, hidden)
    assert r3.shape == x3.shape and r3.dtype == x.dtype, "residual must match x"
    block = triton.next_power_of_2(hidden)
    _rms_norm_kernel[(x3.shape[0], x3.shape[1])](
        x3, r3, weight, out, out if new_res is None else new_res,
        x3.stride(0), x3.stride(1), r3.stride(0), r3.stride(1), hidden, eps,
        HAS_RESIDUAL=residual is not None, BLOCK=block, PDL=pdl, num_warps=_num_warps(block), launch_pdl=pdl)
    return out, new_res


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, pdl: bool = False) -> torch.Tensor:
    """weight * rmsnorm(x) over the last dim; x [..., hidden] (a [T, H, D] view may be strided)."""
    return _launch_rms_norm(x, None, weight, eps, pdl)[0]


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight * rmsnorm(x + residual), x + residual), one pass; new tensors, the inputs are untouched."""
    out, new_res = _launch_rms_norm(x, residual, weight, eps, pdl)
    assert new_res is not None
    return out, new_res


def _heads(q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor,
           head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k as [T, H, D] views, after checking what the rotary kernels assume."""
    num_tokens = q.shape[0]
    q3, k3 = q.view(num_tokens, -1, head_dim), k.view(num_tokens, -1, head_dim)
    assert q.dtype == k.dtype and q3.stride(2) == 1 and k3.stride(2) == 1, "heads must be contiguous"
    assert cos_sin_cache.dtype == torch.float32 and cos_sin_cache.stride(1) == 1
    assert positions.shape == (num_tokens,) and positions.stride(0) == 1 and head_dim % 2 == 0
    return q3, k3


def rotary_inplace(q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor,
                   positions: torch.Tensor, head_dim: int, pdl: bool = False) -> None:
    """Rotate q [T, Hq*D] and k [T, Hk*D] (or [T, H, D]) in place, neox style, at `positions` [T].

    cos_sin_cache: float32 [max_pos, D], row p = cos(p f) | sin(p f). Rows may be strided (views of a
    fused qkv output); each head must be contiguous.
    """
    if q.shape[0] == 0:
        return
    q3, k3 = _heads(q, k, cos_sin_cache, positions, head_dim)
    half = head_dim // 2
    _rotary_kernel[(q3.shape[0], q3.shape[1] + k3.shape[1])](
        q3, k3, cos_sin_cache, positions,
        q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), cos_sin_cache.stride(0),
        q3.shape[1], half, BLOCK=triton.next_power_of_2(half), PDL=pdl, num_warps=1, launch_pdl=pdl,
        enable_fp_fusion=False)  # no FMA: round each product like the PyTorch path


def qk_norm_rotary_inplace(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                           eps: float, cos_sin_cache: torch.Tensor, positions: torch.Tensor,
                           head_dim: int, pdl: bool = False) -> None:
    """RMSNorm each head of q with q_weight [D] and of k with k_weight [D], then rotate as
    `rotary_inplace` does; in place, one launch (the Qwen3 attention prologue)."""
    if q.shape[0] == 0:
        return
    q3, k3 = _heads(q, k, cos_sin_cache, positions, head_dim)
    assert q_weight.shape == k_weight.shape == (head_dim,), "norm weights must be [head_dim]"
    assert q_weight.dtype == k_weight.dtype == q.dtype, "norm weights must be in q's dtype"
    half = head_dim // 2
    _qk_norm_rotary_kernel[(q3.shape[0], q3.shape[1] + k3.shape[1])](
        q3, k3, q_weight, k_weight, cos_sin_cache, positions,
        q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), cos_sin_cache.stride(0),
        q3.shape[1], half, eps, BLOCK=triton.next_power_of_2(half), PDL=pdl, num_warps=1, launch_pdl=pdl,
        enable_fp_fusion=False)


def silu_and_mul(x: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """x [..., 2I] -> silu(x[..., :I]) * x[..., I:] in x's dtype."""
    inter = x.shape[-1] // 2
    assert x.shape[-1] == 2 * inter, "last dim must be even"
    out = torch.empty((*x.shape[:-1], inter), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    x2 = x.reshape(-1, 2 * inter)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    block = min(1024, triton.next_power_of_2(inter))
    _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(inter, block))](
        x2, out, x2.stride(0), inter, BLOCK=block, PDL=pdl, num_warps=_num_warps(block), launch_pdl=pdl)
    return out
