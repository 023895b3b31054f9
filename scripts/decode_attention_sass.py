"""The paged decode kernel's main loop in sm_90 SASS, for a bf16 and an fp8 (e4m3) cache: instructions per KB of
K/V and the commonest opcodes (issue #13: why the fp8 cache's kernel is slower per byte). Needs no GPU: Triton
compiles for sm_90 ahead of time with its bundled ptxas, and its cuobjdump prints the SASS.

    PYTHONPATH=. python scripts/decode_attention_sass.py [--block-n 128] [--warps 4] [--stages 3]

Decode of one query token, 4 query heads per KV head (Llama-3-8B), head_dim 128; the integer arguments a launch
specialises as multiples of 16 (pointers, cache strides, head_dim) are given as such.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from lamina.kernels.decode_attention import _decode_kernel, decode_config  # noqa: E402

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
SIXTEENS = ("stride_c", "stride_q", "stride_o", "head_dim", "num_heads")


def sass(cache: str, overrides: dict) -> str:
    scaled = cache == "*fp8e4nv"
    config = {**decode_config(128, torch.bfloat16, torch.float8_e4m3fn if scaled else torch.bfloat16), **overrides}
    launch = dict(num_warps=config.pop("num_warps"), num_stages=config.pop("num_stages"))
    constexprs = dict(GROUP=4, PAGE=16, BLOCK_D=128, PREC="tf32", SCALED=scaled, MAX_Q=1, BLOCK_M=16, SPLIT=True,
                      PDL=False, TREE=False, **config)
    types = {"k_cache_ptr": cache, "v_cache_ptr": cache, "q_ptr": "*bf16", "out_ptr": "*bf16", "qk_scale": "fp32",
             **{name: "*fp32" for name in ("k_scale_ptr", "v_scale_ptr", "part_acc_ptr", "part_ml_ptr")},
             **{name: "*i32" for name in ("table_ptr", "seq_lens_ptr", "qsl_ptr")}}
    names = _decode_kernel.arg_names
    signature = {a: "constexpr" if a in constexprs else types.get(a, "i32") for a in names}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in names
             if a not in constexprs and (a.endswith("_ptr") or a.startswith(SIXTEENS))}
    compiled = triton.compile(ASTSource(fn=_decode_kernel, signature=signature, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options=launch)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(compiled.asm["cubin"])
        return subprocess.run([BIN / "cuobjdump", "-sass", path], capture_output=True, text=True, check=True).stdout


def main_loop(text: str) -> list[str]:
    """The opcodes of the longest backward branch's body (the K/V tile loop)."""
    ins = [(int(m[1], 16), re.sub(r"^@!?U?P\w+\s+", "", m[2].strip()))
           for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", text)]
    loops = [(int(t[1], 16), addr) for addr, body in ins if body.startswith("BRA")
             for t in [re.search(r"0x([0-9a-f]+)", body)] if t and int(t[1], 16) < addr]
    start, end = max(loops, key=lambda loop: loop[1] - loop[0])
    return [body.split()[0].split(".")[0] for addr, body in ins if start <= addr <= end]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--block-n", type=int, help="fp8 tile keys (default: decode_config's)")
    parser.add_argument("--warps", type=int)
    parser.add_argument("--stages", type=int)
    args = parser.parse_args()
    fp8 = {k: v for k, v in (("BLOCK_N", args.block_n), ("num_warps", args.warps), ("num_stages", args.stages))
           if v is not None}
    for cache, overrides in (("*bf16", {}), ("*fp8e4nv", fp8)):
        config = {**decode_config(128, torch.bfloat16, torch.float8_e4m3fn if "fp8" in cache else torch.bfloat16),
                  **overrides}
        ops = main_loop(sass(cache, overrides))
        kv_kb = 2 * config["BLOCK_N"] * 128 * (1 if "fp8" in cache else 2) / 1024
        print(f"{cache[1:]:8s} {config}: {len(ops)} instructions a tile and warp, "
              f"{config['num_warps'] * len(ops) / kv_kb:.0f} warp-instructions per KB of K/V")
        print("    " + ", ".join(f"{op} {n}" for op, n in Counter(ops).most_common(10)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
