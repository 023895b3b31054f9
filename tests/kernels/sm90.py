"""Compile a Triton kernel for sm_90 (the H200) ahead of time, on a machine without a GPU (triton's own ptxas): what
the compile tests' subprocess scripts share (tests/kernels/test_kernels_compile_for_hopper.py)."""
from __future__ import annotations

from typing import Any


def compile_sm90(fn: Any, constexprs: dict[str, Any], types: dict[str, str], **options: Any) -> Any:
    """`fn` (a @triton.jit function) compiled for sm_90 with `constexprs`; arguments named in `types` take that
    type (pointers: "*bf16", ...), the others i32. Returns triton's CompiledKernel (.asm["ptx"], .asm["cubin"])."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {a: "constexpr" if a in constexprs else types.get(a, "i32") for a in fn.arg_names}
    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                          target=GPUTarget("cuda", 90, 32), options=options)
