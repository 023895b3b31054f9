"""Programmatic dependent launch (PDL, sm_90 and later): a kernel may start while the one before it still runs.

A decode step of a small model, or a batch-1 step of a big one, is hundreds of short kernels in one CUDA graph;
each pays its launch and the ramp of its first loads before any byte streams. With PDL the next kernel's
programs are placed on free SM slots as soon as every program of the current one has started, and run their
prologue (loads of weights, which no kernel writes) while the current one finishes:

    kernel i    | trigger | ........ work ........ | done, writes visible
    kernel i+1            | trigger | weights | wait ---------> | reads x (kernel i's output), work ...

The contract every lamina kernel keeps when launched with PDL (its `PDL` constexpr and `launch_pdl=True`):
  - `launch_dependents(PDL)` once, where the next kernel may be placed: first in the short kernels (norms, RoPE,
    SiLU-and-mul, the KV store, the decode split reduce) and the bf16 GEMV; after the main loop in the weight-only
    GEMV (lamina.kernels.wna16_row) and decode attention, which bounds how many kernels ahead wait on the SMs
    (placement measured per kernel: docs/kernels.md);
  - before `wait(PDL)`, it loads only weights and other tensors that no kernel of the step writes, and stores
    nothing: a predecessor may still be writing its input or reading the buffer its output reuses;
  - `wait(PDL)` on every path, early exits included, before any other access: it returns when the kernel before
    it has completed and its writes are visible, and since that kernel waited on its own predecessor in turn,
    every earlier kernel has completed too. A kernel that does not wait is never launched with PDL.
Kernels without PDL (PyTorch's, cuBLAS's) launch as usual: they start after the kernel before them has completed.
Off CUDA, on GPUs before sm_90 and under the Triton interpreter the constexpr is False and both calls vanish.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

MIN_CUDA = (12, 3)  # CUDA graphs capture a programmatic launch as a programmatic edge from 12.3 on


@functools.cache
def _device_supports(index: int) -> bool:
    cuda = tuple(int(part) for part in (torch.version.cuda or "0.0").split(".")[:2])
    return cuda >= MIN_CUDA and torch.cuda.get_device_capability(index) >= (9, 0)


@triton.jit
def launch_dependents(PDL: tl.constexpr):
    """Let the next kernel in the stream be placed once every program of this one has got here (PDL only)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def wait(PDL: tl.constexpr):
    """Block until the kernel before this one has completed and its writes are visible (PDL only)."""
    if PDL:
        tl.extra.cuda.gdc_wait()


def compiled(x: torch.Tensor) -> bool:
    """Whether Triton kernels over x run compiled for the GPU, where PTX is available (griddepcontrol here, inline
    assembly in lamina.kernels.wna16_row): x on CUDA and the kernels not decorated under the interpreter."""
    return x.is_cuda and not isinstance(wait, InterpretedFunction)


def supported(x: torch.Tensor) -> bool:
    """Whether kernels over x can launch with PDL: x on a CUDA device of compute capability 9.0 or later, torch
    built with CUDA MIN_CUDA or later, and the kernels compiled (the interpreter has no griddepcontrol, even for
    CUDA tensors)."""
    if not compiled(x):
        return False
    return _device_supports(x.device.index if x.device.index is not None else torch.cuda.current_device())
