"""Device and dtype names -> torch objects: the one dtype table and the one `resolve_device`.

    config name (lamina.config.DTYPES)    torch dtype
    "float32"                            torch.float32
    "bfloat16"                           torch.bfloat16
    "float16"                            torch.float16
    "auto"                               resolve_dtype: the checkpoint's dtype on a GPU, float32 on the CPU

Kept apart from lamina.config so that reading a config (the CLI's --help) does not import torch.
"""
from __future__ import annotations

import numpy as np
import torch

from lamina.config import DTYPES, ModelArch

TORCH_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPES if name != "auto"}
MODEL_DTYPES: tuple[torch.dtype, ...] = tuple(TORCH_DTYPES.values())  # the dtypes a model may run in


def resolve_device(name: str) -> torch.device:
    """"auto" is CUDA when a GPU is available, else the CPU; "cuda" (or "cuda:N") without one is a ValueError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device: {name!r} was asked for but no CUDA GPU is available; use 'cpu' or 'auto'")
    return torch.device(name)


def resolve_dtype(name: str, arch: ModelArch, device: torch.device) -> torch.dtype:
    """"auto" runs the checkpoint's dtype on a GPU (bfloat16 when it names none we run) and float32 on the
    CPU (exact and fast there); any other name is looked up in TORCH_DTYPES."""
    if name != "auto":
        return TORCH_DTYPES[name]
    if device.type == "cpu":
        return torch.float32
    return TORCH_DTYPES.get(arch.torch_dtype or "", torch.bfloat16)


ALIGN_BYTES = 16  # every packed field starts 16-byte aligned, like a tensor of its own


def to_host_async(t: torch.Tensor) -> torch.Tensor:
    """Queue a copy of a device tensor into pinned host memory and return it (valid once the stream has reached
    the copy: record an event to wait for); CPU tensors are returned as they are."""
    if t.device.type == "cpu":
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return host.copy_(t, non_blocking=True)


def packed_to_device(fields: list[np.ndarray], dtype: type, device: torch.device) -> list[torch.Tensor]:
    """Copy `fields` to the device in one non-blocking copy; returns one view per field.

    Each field starts on an ALIGN_BYTES boundary: Triton specializes a kernel on the alignment of its
    pointer arguments, so a field at an offset that changes with the batch size would compile a new
    kernel variant mid-run (W1 lost 2 s to that)."""
    step = ALIGN_BYTES // np.dtype(dtype).itemsize
    sizes = [len(f) for f in fields]
    padded = [-(-n // step) * step for n in sizes]
    packed = np.zeros(sum(padded), dtype=dtype)
    offset = 0
    for values, size in zip(fields, padded):
        packed[offset:offset + len(values)] = values
        offset += size
    parts = torch.from_numpy(packed).to(device, non_blocking=True).split(padded)
    return [part[:n] for part, n in zip(parts, sizes)]
