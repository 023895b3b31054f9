"""The KV-store and attention kernels compile for sm_90 (the H200) ahead of time, on this GPU-less machine, with a
16-bit and with an fp8 cache, and so does every fp8 GEMM config the H200's table routes to: the interpreter runs
Python and forgives what the compiler refuses (a global that is not a tl.constexpr passed every interpreter test
and failed on the H200)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is not installed (CI installs it with the test extra)")

REPO = Path(__file__).resolve().parents[2]


def run_compiled(script: str, *args: str) -> subprocess.CompletedProcess:
    """`script` in a fresh Python without TRITON_INTERPRET (so @triton.jit compiles), from the repository root
    (the scripts import tests.kernels.sm90)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=300)

SCRIPT = textwrap.dedent('''
    import sys
    import torch
    from lamina.kernels.decode_attention import _decode_kernel, decode_config
    from lamina.kernels.prefill_attention import _prefill_kernel
    from lamina.kernels.store_kv import _store_kv_kernel
    from tests.kernels.sm90 import compile_sm90

    cache = sys.argv[1]
    types = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "out_ptr": "*bf16", "k_cache_ptr": cache,
             "v_cache_ptr": cache, "slot_ptr": "*i64", "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32",
             "part_acc_ptr": "*fp32", "part_ml_ptr": "*fp32", "table_ptr": "*i32", "seq_lens_ptr": "*i32",
             "qsl_ptr": "*i32", "qk_scale": "fp32", "ctx_ptr": "*i64", "bits_ptr": "*i64"}
    scaled = cache == "*fp8e4nv"
    attention = dict(GROUP=2, PAGE=16, BLOCK_N=64, BLOCK_D=128, PREC="tf32", SCALED=scaled)
    decode = decode_config(128, torch.bfloat16, torch.float8_e4m3fn if scaled else torch.bfloat16)
    launch = dict(num_warps=decode.pop("num_warps"), num_stages=decode.pop("num_stages"))
    for fn, constexprs in ((_store_kv_kernel, dict(BLOCK_H=8, BLOCK_D=128, SCALED=scaled, PDL=True)),
                           (_decode_kernel, dict(attention, MAX_Q=8, BLOCK_M=16, SPLIT=True, PDL=True, TREE=False,
                                                 **decode)),
                           (_decode_kernel, dict(attention, MAX_Q=8, BLOCK_M=16, SPLIT=True, PDL=True, TREE=True,
                                                 **decode)),
                           (_prefill_kernel, dict(attention, BLOCK_M=64))):
        compiled = compile_sm90(fn, constexprs, types, **launch, launch_pdl=constexprs.get("PDL", False))
        assert compiled.asm["cubin"], fn.__name__
        print(fn.__name__, "ok")
''')


@pytest.mark.parametrize("cache", ["*bf16", "*fp8e4nv"])
def test_kernels_compile_for_sm90(cache: str) -> None:
    done = run_compiled(SCRIPT, cache)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["_store_kv_kernel", "ok", "_decode_kernel", "ok", "_decode_kernel", "ok",
                                   "_prefill_kernel", "ok"]  # decode: causal, then with a tree mask


FP8_GEMM_SCRIPT = textwrap.dedent('''
    from lamina.kernels.fp8_gemm import _fp8_gemm_kernel, device_table
    from tests.kernels.sm90 import compile_sm90

    configs = {cfg for buckets in device_table("NVIDIA H200").values() for _, cfg in buckets if cfg is not None}
    types = {"x_ptr": "*fp8e4nv", "w_ptr": "*fp8e4nv", "sx_ptr": "*fp32", "sw_ptr": "*fp32", "out_ptr": "*bf16"}
    for cfg in sorted(configs, key=lambda c: c.name):
        constexprs = dict(SWAP=cfg.swap, EVEN_K=True, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k)
        compiled = compile_sm90(_fp8_gemm_kernel, constexprs, types, num_warps=cfg.num_warps,
                                num_stages=cfg.num_stages)
        assert compiled.asm["cubin"] and compiled.metadata.shared <= 232448, cfg.name  # the H200's shared memory
        print(cfg.name, "ok")
''')


def test_the_shipped_fp8_gemm_configs_compile_for_sm90() -> None:
    """Every config the H200's fp8 GEMM table routes to compiles for sm_90 and fits its shared memory."""
    done = run_compiled(FP8_GEMM_SCRIPT)
    assert done.returncode == 0, done.stderr[-3000:]
    names = done.stdout.split()[::2]
    assert len(names) >= 4 and done.stdout.split()[1::2] == ["ok"] * len(names)


PDL_SCRIPT = textwrap.dedent('''
    from lamina.kernels import decode_attention, fused_ops, gemv, store_kv, wna16_row, wna16_tc
    from tests.kernels.sm90 import compile_sm90

    def ops_in_order(name, fn, constexprs, types, **options):
        """Each griddepcontrol, and each run of global loads / stores / atomics, in PTX order."""
        compiled = compile_sm90(fn, dict(constexprs, PDL=True), types, **options, launch_pdl=True)
        ops = []
        for line in compiled.asm["ptx"].splitlines():
            words = line.split()
            op = words[1] if words and words[0].startswith("@") else (words[0] if words else "")
            op = op.rstrip(";") if op.startswith("griddepcontrol") else op.split(".")[0] if ".global" in op else None
            if op and (not ops or ops[-1] != op):
                ops.append(op)
        print(name, " ".join(ops))

    types = {"x_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "out_ptr": "*bf16", "ws_ptr": "*fp32",
             "res_ptr": "*bf16", "new_res_ptr": "*bf16", "q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16",
             "cache_ptr": "*fp32", "pos_ptr": "*i64", "eps": "fp32", "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16",
             "slot_ptr": "*i64", "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32", "part_acc_ptr": "*fp32",
             "part_ml_ptr": "*fp32", "table_ptr": "*i32", "seq_lens_ptr": "*i32", "qsl_ptr": "*i32",
             "qk_scale": "fp32"}
    ops_in_order("gemv", gemv._gemv_kernel, dict(M=1, HAS_BIAS=False, SPLIT_K=1, EVEN_K=True, BLOCK_N=2,
                                                 BLOCK_K=4096), types, num_warps=8)
    ops_in_order("wna16_row", wna16_row._wna16_row_kernel,
                 dict(BITS=8, XOR=0, GROUP_KW=1 << 30, HAS_ZERO=False, HAS_BIAS=False, EVEN_K=True, M=1, BLOCK_N=4,
                      BLOCK_KW=128, IS_SPLIT=True, PREFETCH=True, PRMT=True),
                 dict(types, x_ptr="*i32", w_ptr="*i32", s_ptr="*bf16", z_ptr="*i8", cnt_ptr="*i32"), num_warps=1)
    ops_in_order("wna16_tc", wna16_tc._wna16_tc_kernel,
                 dict(BITS=4, XOR=0, GROUP_KW=16, HAS_ZERO=True, HAS_BIAS=True, TILES=2, CHUNKS=2, IS_SPLIT=True,
                      PREFETCH=True, XB=1, COMPILED=True),
                 dict(types, x_ptr="*i32", w_ptr="*i32", s_ptr="*bf16", z_ptr="*i8", cnt_ptr="*i32"), num_warps=1)
    ops_in_order("rms_norm", fused_ops._rms_norm_kernel, dict(HAS_RESIDUAL=True, BLOCK=4096), types, num_warps=8)
    ops_in_order("rotary", fused_ops._rotary_kernel, dict(BLOCK=64), types, num_warps=1)
    ops_in_order("silu_and_mul", fused_ops._silu_and_mul_kernel, dict(BLOCK=1024), types, num_warps=4)
    ops_in_order("store_kv", store_kv._store_kv_kernel, dict(BLOCK_H=8, BLOCK_D=128, SCALED=False), types,
                 num_warps=4)
    ops_in_order("decode_attention", decode_attention._decode_kernel,
                 dict(GROUP=4, MAX_Q=1, PAGE=16, BLOCK_M=16, BLOCK_N=64, BLOCK_D=128, SPLIT=True, PREC="tf32",
                      SCALED=False, F16_DOT=False, TREE=False), types, num_warps=4, num_stages=3)
    ops_in_order("decode_reduce", decode_attention._reduce_kernel, dict(MAX_Q=1, BLOCK_S=64, BLOCK_D=128), types,
                 num_warps=4)
''')

# Each kernel's PTX up to its wait: the GEMVs and the norm load their weights first (so that those loads overlap the
# kernel before); the weight-only GEMV and decode attention let the next kernel in only after their main loop.
BEFORE_WAIT = {"gemv": ["griddepcontrol.launch_dependents", "ld"], "wna16_row": ["ld"], "wna16_tc": ["ld"],
               "rms_norm": ["griddepcontrol.launch_dependents", "ld"], "rotary": ["griddepcontrol.launch_dependents"],
               "silu_and_mul": ["griddepcontrol.launch_dependents"], "store_kv": ["griddepcontrol.launch_dependents"],
               "decode_attention": [], "decode_reduce": ["griddepcontrol.launch_dependents"]}


def test_pdl_kernels_wait_before_they_touch_what_the_kernel_before_writes() -> None:
    """Launched with programmatic dependent launch (lamina.kernels.pdl), every decode-step kernel waits before it
    touches data the kernel before it may write: before the wait, weight loads at most, no store, no atomic; and it
    lets the next kernel in exactly once. Checked in the sm_90 PTX, the order the GPU executes."""
    done = run_compiled(PDL_SCRIPT)
    assert done.returncode == 0, done.stderr[-3000:]
    orders = {name: ops.split() for name, ops in (line.split(" ", 1) for line in done.stdout.strip().splitlines())}
    assert set(orders) == set(BEFORE_WAIT)
    for name, ops in orders.items():
        wait = ops.index("griddepcontrol.wait")
        assert ops[:wait] == BEFORE_WAIT[name], (name, ops)
        assert ops.count("griddepcontrol.launch_dependents") == 1, (name, ops)


PRMT_SCRIPT = textwrap.dedent('''
    import re
    from lamina.kernels import wna16_row
    from tests.kernels.sm90 import compile_sm90

    constexprs = dict(BITS=8, XOR=0, GROUP_KW=1 << 30, HAS_ZERO=False, HAS_BIAS=False, EVEN_K=True, M=1, BLOCK_N=1,
                      BLOCK_KW=128, IS_SPLIT=False, PREFETCH=False, PDL=False, PRMT=True)
    types = {"x_ptr": "*i32", "w_ptr": "*i32", "s_ptr": "*bf16", "z_ptr": "*i8", "b_ptr": "*bf16",
             "out_ptr": "*bf16", "ws_ptr": "*fp32", "cnt_ptr": "*i32"}
    ptx = compile_sm90(wna16_row._wna16_row_kernel, constexprs, types, num_warps=1).asm["ptx"]
    print(" ".join(re.findall(r"prmt\\.b32\\s+[^;]*,\\s*(0x[0-9a-fA-F]+);", ptx)))
''')


def _prmt(a: int, b: int, selector: int) -> int:
    """PTX prmt.b32 in its default mode: byte i of the result is byte (selector >> 4i) & 7 of b:a (sign bit 0)."""
    pool = (b << 32 | a).to_bytes(8, "little")
    assert all(not (selector >> 4 * i) & 8 for i in range(4)), "sign-replicating selectors are not used"
    return int.from_bytes(bytes(pool[(selector >> 4 * i) & 7] for i in range(4)), "little")


def test_int8_gemv_unpacks_each_byte_with_one_prmt() -> None:
    """Compiled for sm_90, the int8 weight-only GEMV turns each weight byte into 32768 + u with one PRMT: one
    selector per byte position, each giving the bits the interpreter's shift-and-LOP3 path gives."""
    from lamina.kernels.wna16_row import MAGIC8

    done = run_compiled(PRMT_SCRIPT)
    assert done.returncode == 0, done.stderr[-3000:]
    selectors = sorted({int(s, 16) for s in done.stdout.split()})
    assert len(selectors) == 4, done.stdout
    words = [0, 0xFFFFFFFF, 0x80808080, 0x7F00FF01, 0x12345678, 0xDEADBEEF]
    for j, selector in enumerate(selectors):
        for w in words:
            assert _prmt(w, MAGIC8, selector) == ((w >> 8 * j) & 0xFF) << 8 | MAGIC8, (hex(selector), hex(w))


TC_SCRIPT = textwrap.dedent('''
    import sys
    from lamina.kernels import wna16_tc
    from tests.kernels.sm90 import compile_sm90

    bits = int(sys.argv[1])
    constexprs = dict(BITS=bits, XOR=0 if bits == 4 else -0x7F7F7F80, GROUP_KW=16, HAS_ZERO=bits == 4,
                      HAS_BIAS=bits == 8, TILES=2, CHUNKS=2, IS_SPLIT=bits == 4, PREFETCH=True, XB=bits // 4,
                      PDL=False, COMPILED=True)
    types = {"x_ptr": "*i32", "w_ptr": "*i32", "s_ptr": "*bf16", "z_ptr": "*i8", "b_ptr": "*bf16",
             "out_ptr": "*bf16", "ws_ptr": "*fp32", "cnt_ptr": "*i32"}
    compiled = compile_sm90(wna16_tc._wna16_tc_kernel, constexprs, types, num_warps=1)
    ptx, ttgir = compiled.asm["ptx"], compiled.asm["ttgir"]
    print(compiled.metadata.shared, ptx.count("mma.sync.aligned.m16n8k16"), ttgir.count("convert_layout"))
''')


@pytest.mark.parametrize("bits", [4, 8])
def test_tensor_core_gemv_compiles_from_registers(bits: int) -> None:
    """lamina.kernels.wna16_tc compiles for sm_90 (its inline PTX assembles) with its MMAs fed from registers: no
    layout conversion (one of the K loop's sums would stage them through shared memory every step) and no shared
    memory but split K's 4 bytes (the arrival counter's value, broadcast to the warp; int4 is split here, int8 has
    two blocks of x's rows)."""
    done = run_compiled(TC_SCRIPT, str(bits))
    assert done.returncode == 0, done.stderr[-3000:]
    shared, mmas, conversions = map(int, done.stdout.split())
    assert shared == (4 if bits == 4 else 0) and conversions == 0 and mmas > 0, done.stdout


SAMPLING_SCRIPT = textwrap.dedent('''
    from lamina.kernels.sampling import BLOCK_V, NUM_WARPS, _sample_kernel
    from tests.kernels.sm90 import compile_sm90

    outside = {"logits_ptr": "*fp32", "temperature_ptr": "*fp32", "top_p_ptr": "*fp32", "min_p_ptr": "*fp32",
               "kth_ptr": "*fp32", "seed_ptr": "*i64", "argmax_ptr": "*i64", "out_ptr": "*i64", "stride_row": "i64"}
    in_graph = dict(outside, logits_ptr="*bf16", temperature_ptr="*fp64", top_p_ptr="*fp64", min_p_ptr="*fp64",
                    kth_ptr="*fp64")
    for name, types, flags in (
            ("outside", outside, dict(HAS_TOP_P=True, HAS_MIN_P=True, HAS_KTH=True, HAS_ARGMAX=False)),
            ("in_graph", in_graph, dict(HAS_TOP_P=True, HAS_MIN_P=True, HAS_KTH=False, HAS_ARGMAX=True))):
        compiled = compile_sm90(_sample_kernel, dict(flags, vocab=151936, BLOCK=BLOCK_V), types,
                                num_warps=NUM_WARPS)
        assert compiled.asm["cubin"], name
        print(name, "ok")
''')


def test_the_sampling_kernel_compiles_for_sm90_as_the_graphs_call_it() -> None:
    """The sampling kernel as the sampler launches it (float32 rows, top-k), and as the CUDA graphs capture it
    (lamina/worker/cuda_graphs.py: float64 parameter rows, each row's argmax given; greedy rows copy it)."""
    done = run_compiled(SAMPLING_SCRIPT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["outside", "ok", "in_graph", "ok"]
