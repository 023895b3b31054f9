"""The collectives of tensor parallelism, each a no-op on a group of one rank.

Forward-path collectives (`all_reduce`, `all_gather`) run on the group's device group (NCCL on CUDA: they are
captured by CUDA graphs like any kernel, once the communicator exists; gloo on CPU). Object collectives
(`broadcast_object`, `all_gather_objects`) carry the executor's control messages over the gloo cpu group.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from lamina.distributed.parallel_state import TensorParallelGroup


def all_reduce(x: torch.Tensor, group: TensorParallelGroup) -> torch.Tensor:
    """Sum `x` over the ranks, in place (x must be contiguous); returns x."""
    if group.size == 1:
        return x
    dist.all_reduce(x, group=group.device_group)
    return x


def all_gather(x: torch.Tensor, group: TensorParallelGroup, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's `x` (same shape on every rank) along `dim`, in rank order."""
    if group.size == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(group.size)]
    dist.all_gather(parts, x, group=group.device_group)
    return torch.cat(parts, dim=dim)


def broadcast_object(obj: Any, group: TensorParallelGroup) -> Any:
    """Rank 0's `obj` on every rank (pickled; the others pass None)."""
    if group.size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=group.cpu_group)
    return box[0]


def all_gather_objects(obj: Any, group: TensorParallelGroup) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank."""
    if group.size == 1:
        return [obj]
    out: list[Any] = [None] * group.size
    dist.all_gather_object(out, obj, group=group.cpu_group)
    return out
