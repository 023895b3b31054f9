"""wna16_row's and wna16_gemv's sm_90 SASS, compiled ahead of time on any machine (no GPU: triton's bundled ptxas
and cuobjdump): instructions per int32 weight word in each kernel's main loop, registers and spills, for the
configs the designs were chosen by (issue #13).

    PYTHONPATH=. python scripts/wna16_gemv_variants.py --sass      # or: PYTHONPATH=. python scripts/wna16_gemv_sass.py
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"  # triton's own ptxas and cuobjdump


def describe_error(exc: BaseException) -> str:
    """An exception in one line (its type and the first 200 characters of its first line)."""
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"


def disassemble(cubin: bytes) -> tuple[str, str]:
    """(SASS, resource usage) of a compiled kernel, by triton's bundled cuobjdump."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "k.cubin"
        path.write_bytes(cubin)
        return tuple(subprocess.run([BIN / "cuobjdump", flag, path], capture_output=True, text=True).stdout
                     for flag in ("-sass", "-res-usage"))


def sass_report() -> int:
    """Print each case's main-loop instructions per word, registers, stack and its most frequent opcodes."""
    ptr_types = {"x_ptr": "*i32", "w_ptr": "*i32", "wt_ptr": "*i32", "mt_ptr": "*i32", "s_ptr": "*bf16",
                 "z_ptr": "*i8", "b_ptr": "*bf16", "out_ptr": "*bf16", "ws_ptr": "*fp32", "cnt_ptr": "*i32"}
    from lamina.kernels.wna16_gemv import _wna16_gemv_kernel
    from lamina.kernels.wna16_row import _wna16_row_kernel as _rowpair_kernel

    rp4 = dict(BITS=4, XOR=0, GROUP_KW=16, HAS_ZERO=True, HAS_BIAS=False, EVEN_K=True, M=1, BLOCK_KW=128,
               PDL=False, PRMT=False)
    rp8 = dict(rp4, BITS=8, GROUP_KW=1 << 30, HAS_ZERO=False, PRMT=True)
    cases = [  # (label, kernel, constexprs, warps, stages, words per thread per main-loop iteration)
        ("current n4-kw512-w4", _wna16_gemv_kernel, dict(M=1, BITS=4, XOR=0, HAS_ZERO=True, HAS_BIAS=False,
                                                         EVEN_K=True, BLOCK_N=4, GROUPS=128, GROUP_W=4), 4, 1, 16),
        ("rowpair int4 n8-w1 pf", _rowpair_kernel, dict(rp4, BLOCK_N=8, IS_SPLIT=True, PREFETCH=True), 1, 1, 32),
        ("rowpair int4 n16-w1", _rowpair_kernel, dict(rp4, BLOCK_N=16, IS_SPLIT=False, PREFETCH=False), 1, 1, 64),
        ("rowpair int8 n8-w1", _rowpair_kernel, dict(rp8, BLOCK_N=8, IS_SPLIT=False, PREFETCH=False), 1, 1, 32),
        ("rowpair int8 n8-w1 no PRMT", _rowpair_kernel, dict(rp8, BLOCK_N=8, IS_SPLIT=False, PREFETCH=False,
                                                             PRMT=False), 1, 1, 32),
    ]
    for m in (1, 2, 4):  # the engine's form: n4, prefetch, split; int8 naive (the sign XOR); M rows of x
        cases += [(f"rowpair int4 n4-w1 pf M={m}", _rowpair_kernel, dict(rp4, M=m, BLOCK_N=4, IS_SPLIT=True,
                                                                          PREFETCH=True), 1, 1, 16),
                  (f"rowpair int8 n4-w1 pf M={m}", _rowpair_kernel, dict(rp8, M=m, XOR=-0x7F7F7F80, BLOCK_N=4,
                                                                          IS_SPLIT=True, PREFETCH=True), 1, 1, 16)]
    for label, fn, ce, warps, stages, words in cases:
        sig = {a: "constexpr" if a in ce else ptr_types.get(a, "i32") for a in fn.arg_names}
        if fn is _wna16_gemv_kernel:  # x read as bf16
            sig.update(x_ptr="*bf16", **({"b_ptr": "*bf16"} if "b_ptr" in sig else {}))
        # as a launch specialises them: pointers, sizes and strides divisible by 16 (not the magic numbers)
        runtime = [a for a in fn.arg_names if a not in ce and a not in ("magic", "m16", "magic2", "split")]
        attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in runtime}
        try:
            src = ASTSource(fn=fn, signature=sig, constexprs=ce, attrs=attrs)
            comp = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps,
                                                                                     num_stages=stages))
            sass, res = disassemble(comp.asm["cubin"])
        except Exception as exc:  # noqa: BLE001
            print(f"{label}: {describe_error(exc)}")
            continue
        ins = [(int(m.group(1), 16), m.group(2).strip()) for m in
               re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
        loops = []
        for addr, text in ins:
            body = re.sub(r"^@!?U?P\w+\s+", "", text)
            if body.startswith("BRA"):
                tgt = re.search(r"0x([0-9a-f]+)", body)
                if tgt and int(tgt.group(1), 16) < addr:
                    loops.append((int(tgt.group(1), 16), addr))
        def weight_loads(lh: tuple[int, int]) -> int:  # the K loop: the one with the evict-first weight loads
            return sum(1 for a, t in ins if lh[0] <= a <= lh[1] and "LDG.E.EF" in t)
        main = max(loops, key=lambda lh: (weight_loads(lh), lh[1] - lh[0])) if loops else (0, 0)
        body = [re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for a, t in ins if main[0] <= a <= main[1]]
        regs = re.search(r"REG:(\d+)", res)
        stack = re.search(r"STACK:(\d+)", res)
        top = ", ".join(f"{o} {c}" for o, c in Counter(body).most_common(8))
        print(f"{label:<26} main loop {len(body):>4} instr / {words} words = {len(body) / words:5.1f} per word; "
              f"regs {regs and regs.group(1)}, stack {stack and stack.group(1)}; {top}")
    return 0


if __name__ == "__main__":
    sys.exit(sass_report())
