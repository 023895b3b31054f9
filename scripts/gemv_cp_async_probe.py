"""Probe (issue #13): does an int8 weight-only GEMV stream faster when its weight tiles go global -> shared memory by
cp.async, several tiles in flight per warp without holding registers, than lamina.kernels.wna16_row (register
prefetch of one tile)? Nsight Compute put wna16_row's int8 stalls on the tile it waits for, with 11-26 warps an SM
(docs/BENCHMARKS.md, twenty-second session); Triton's pipeliner emits no cp.async for these loads, so this kernel is
written in Gluon (triton.experimental.gluon: explicit layouts, shared memory and async copies).

    python scripts/gemv_cp_async_probe.py            # CUDA: Llama-3-8B shapes, int8 per channel, one row of x
    python scripts/gemv_cp_async_probe.py --sass     # any machine: compile for sm_90 ahead of time, count SASS

A measurement tool, not an engine kernel: one row of x (given as four fp32 planes xt[j, c] = x[4c + j], made once
per shape, outside the timing), symmetric per-channel int8 packed 4 to a word (u = q + 128,
lamina/quant/packing.py), N a multiple of BLOCK_N and K of 4 * BLOCK_KW, no split K, no bias. Per word: four
bytes made exact floats (q = float(0x4B000000 | u) - 2^23 - 128), four FFMAs; the scale once per row at the end.
Checked against an fp32 reference; timed like scripts/wna16_gemv_variants.py (CUDA graphs over > 256 MB of
weight copies), against wna16_row's default config.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

SHAPES = [("qkv", 6144, 4096), ("o_proj", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336),
          ("lm_head", 128256, 4096)]
CONFIGS = [(4, 128, 3, 1), (2, 128, 4, 1), (4, 256, 3, 2), (1, 256, 4, 1), (1, 512, 3, 1), (1, 1024, 2, 1),
           (2, 512, 2, 1), (1, 1024, 2, 2), (1, 512, 3, 2)]  # BLOCK_N, BLOCK_KW, STAGES, warps


@gluon.jit
def _cp_async_gemv_kernel(xt_ptr, w_ptr, s_ptr, out_ptr, KW, stride_wn, BLOCK_N: gl.constexpr,
                          BLOCK_KW: gl.constexpr, STAGES: gl.constexpr, WARPS: gl.constexpr):
    """out[n] = s[n] * sum_c sum_j (u_j(w[n, c]) - 128) * xt[j, c] for BLOCK_N rows; tiles of BLOCK_KW words in a
    ring of STAGES shared-memory slots, STAGES - 1 in flight while one is used. Each thread copies and reads the
    same 16 bytes of every row (one layout for the copy and the read: no barrier needed)."""
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [1, WARPS], [1, 0])
    ring: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, BLOCK_KW], ring)
    rows = gl.program_id(0) * BLOCK_N + gl.arange(0, BLOCK_N, gl.SliceLayout(1, layout))
    cols = gl.arange(0, BLOCK_KW, gl.SliceLayout(0, layout))
    ptrs = w_ptr + rows.to(gl.int64)[:, None] * stride_wn + cols[None, :]
    tiles = KW // BLOCK_KW
    for s in gl.static_range(STAGES - 1):
        ok = gl.full([BLOCK_N, BLOCK_KW], s, gl.int32, layout) < tiles
        async_copy.async_copy_global_to_shared(smem.index(s), ptrs + s * BLOCK_KW, mask=ok)
        async_copy.commit_group()
    acc = gl.zeros([BLOCK_N, BLOCK_KW], gl.float32, layout)
    for i in range(tiles):
        async_copy.wait_group(STAGES - 2)
        w = smem.index(i % STAGES).load(layout)
        ahead = i + STAGES - 1
        ok = gl.full([BLOCK_N, BLOCK_KW], ahead, gl.int32, layout) < tiles
        async_copy.async_copy_global_to_shared(smem.index(ahead % STAGES), ptrs + ahead * BLOCK_KW, mask=ok)
        async_copy.commit_group()
        for j in gl.static_range(4):
            xj = gl.load(xt_ptr + j * KW + i * BLOCK_KW + cols)
            byte = ((w >> (8 * j)) & 0xFF) | 0x4B000000
            q = byte.to(gl.float32, bitcast=True) - 8388736.0  # 2^23 + 128: exact
            acc += q * xj[None, :]
    async_copy.wait_group(0)
    total = gl.sum(acc, axis=1)
    scale = gl.load(s_ptr + rows).to(gl.float32)
    gl.store(out_ptr + rows, (total * scale).to(out_ptr.dtype.element_ty))


def planes(x: torch.Tensor) -> torch.Tensor:
    """x [1, K] bf16 -> xt [4, K / 4] fp32, xt[j, c] = x[4c + j] (made once per shape: the probe times the loads)."""
    return x.float().view(-1, 4).t().contiguous()


def cp_async_gemv(xt: torch.Tensor, words: torch.Tensor, scale: torch.Tensor, cfg: tuple[int, int, int, int]
                  ) -> torch.Tensor:
    """x @ dequantize(int8 words, per-channel scale [N, 1]).T -> [1, N] bf16, x given as planes(x)."""
    block_n, block_kw, stages, warps = cfg
    n, kw = words.shape
    assert xt.shape == (4, kw) and n % block_n == 0 and kw % block_kw == 0, (xt.shape, words.shape, cfg)
    out = torch.empty((1, n), dtype=torch.bfloat16, device=xt.device)
    _cp_async_gemv_kernel[(n // block_n,)](xt, words, scale, out, kw, words.stride(0), BLOCK_N=block_n,
                                           BLOCK_KW=block_kw, STAGES=stages, WARPS=warps, num_warps=warps)
    return out


def name(cfg: tuple[int, int, int, int]) -> str:
    return "n{}-kw{}-st{}-w{}".format(*cfg)


def sass() -> int:
    """Compile each config for sm_90 ahead of time (triton's bundled ptxas): registers, shared memory, and whether
    the copies are LDGSTS (cp.async)."""
    import re

    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from wna16_gemv_sass import disassemble  # scripts/wna16_gemv_sass.py, beside this file

    fn = _cp_async_gemv_kernel
    for cfg in CONFIGS:
        block_n, block_kw, stages, warps = cfg
        ce = dict(BLOCK_N=block_n, BLOCK_KW=block_kw, STAGES=stages, WARPS=warps)
        sig = dict(xt_ptr="*fp32", w_ptr="*i32", s_ptr="*bf16", out_ptr="*bf16", KW="i32", stride_wn="i32", **{
            c: "constexpr" for c in ce})
        attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in ("xt_ptr", "w_ptr", "s_ptr", "out_ptr",
                                                                                "KW", "stride_wn")}
        comp = triton.compile(GluonASTSource(fn, sig, ce, attrs), target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=warps))
        text, res = disassemble(comp.asm["cubin"])
        usage = " ".join(re.search(pattern, res).group(0) for pattern in (r"REG:\d+", r"SHARED:\d+", r"STACK:\d+"))
        counts = ", ".join(f"{op} {text.count(op)}" for op in ("LDGSTS", "LDG.E", "LDS", "BAR.SYNC", "FFMA", ";"))
        print(f"{name(cfg):<18} {usage}; {counts}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sass", action="store_true")
    parser.add_argument("--shapes", nargs="*")
    args = parser.parse_args()
    if args.sass:
        return sass()
    from lamina.bench.gemv_sweep import _time_per_call
    from lamina.bench.quant_speed import quant_copy, reference
    from lamina.kernels.wna16_row import wna16_row_gemv

    out_dir = Path(os.environ.get("OUT") or "out")
    out_dir.mkdir(parents=True, exist_ok=True)
    report = dict(workload="gemv-cp-async-probe", date=time.strftime("%Y-%m-%d %H:%M:%S"),
                  device=torch.cuda.get_device_name(), triton=triton.__version__, command=" ".join(sys.argv), rows=[])
    gen = torch.Generator(device="cuda").manual_seed(0)
    for shape, n, k in SHAPES:
        if args.shapes and shape not in args.shapes:
            continue
        x = torch.randn(1, k, device="cuda", generator=gen).to(torch.bfloat16)
        xt = planes(x)
        first = quant_copy(n, k, 8, None, True, "cuda", gen)
        count = max(2, math.ceil(256 * 2 ** 20 / first["bytes"]))
        ops = [first] + [quant_copy(n, k, 8, None, True, "cuda", gen) for _ in range(count - 1)]
        calls = [ops[i % count] for i in range(max(count, 16))]
        ref = reference(x, first, k).float()
        top = ref.abs().max().item()
        row = dict(shape=shape, n=n, k=k, bytes=first["bytes"], kernels={})

        def record(label: str, run, calls: list = calls) -> None:  # noqa: ANN001
            try:
                err = (run(first).float() - ref).abs().max().item() / top
                us = _time_per_call([lambda op=op: run(op) for op in calls], "cuda", 3, 15) if err < 2 ** -6 else None
                row["kernels"][label] = dict(err=err, us=us, gbs=us and first["bytes"] / us / 1e3)
            except Exception as exc:  # noqa: BLE001 - compile error, out of resources: record, keep going
                row["kernels"][label] = dict(error=f"{type(exc).__name__}: {str(exc)[:300]}")
            print(shape, label, row["kernels"][label], flush=True)

        record("wna16_row default", lambda op: wna16_row_gemv(x, op["words"], op["scale"], None, None, 8, None))
        for cfg in CONFIGS:
            record(name(cfg), lambda op, c=cfg: cp_async_gemv(xt, op["words"], op["scale"], c))
        report["rows"].append(row)
        (out_dir / "gemv-cp-async-probe.json").write_text(json.dumps(report, indent=1))
        del ops, calls
        torch.cuda.empty_cache()
    for row in report["rows"]:
        cells = "  ".join(f"{label}: {v['us']:.1f}" if v.get("us") else f"{label}: -"
                          for label, v in row["kernels"].items())
        print(f"{row['shape']:<8} {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
