"""The tensor-parallel group: which rank this process is, how many ranks there are, and the process groups.

    TensorParallelGroup(rank, size), and the process's torch.distributed groups:
        device_group   the collectives of the forward (all-reduce, all-gather): NCCL on CUDA, gloo on CPU
        cpu_group      the executor's control messages (step messages, setup calls): always gloo

A model is built inside `building(group)`: every parallel layer reads `current_group()` once, in its
constructor, and keeps the group (so a TP=1 model and a TP=2 model can live in one process: only the
TP=2 one was built inside `building`). Outside `building` the group is SINGLE: rank 0 of 1, no
communication at all.

One tensor-parallel engine per process: `init_tensor_parallel` creates torch.distributed's default group
(rank 0 is the engine's process), `destroy_tensor_parallel` ends it.
"""
from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

# Idle workers wait for the next step message inside a gloo broadcast, which times out after this long: an idle
# engine must not lose its workers. A dead rank is not found by this timeout but at once: its sockets close.
CONTROL_TIMEOUT = datetime.timedelta(days=30)
# The forward's NCCL collectives: a rank stuck this long inside one is broken (the watchdog aborts).
DEVICE_TIMEOUT = datetime.timedelta(minutes=10)


@dataclass
class _ProcessGroups:
    """The live torch.distributed groups. Held here only (not by the models, which outlive them): once
    destroyed, nothing keeps their threads alive until interpreter exit (which aborts the process)."""

    device: Any = None
    cpu: Any = None


_groups = _ProcessGroups()


@dataclass(frozen=True)
class TensorParallelGroup:
    rank: int
    size: int

    @property
    def is_parallel(self) -> bool:
        return self.size > 1

    @property
    def device_group(self) -> Any:
        """The process group of the forward's collectives (None at size 1)."""
        return _groups.device if self.is_parallel else None

    @property
    def cpu_group(self) -> Any:
        """The gloo group of the control messages (None at size 1)."""
        return _groups.cpu if self.is_parallel else None


SINGLE = TensorParallelGroup(rank=0, size=1)


@dataclass(frozen=True)
class ExternalLaunch:
    """This process was started by `torchrun` (lamina/launch.py read its environment): the
    executor joins the group through `env://` instead of spawning workers. `local_rank` picks cuda:local_rank."""

    rank: int
    world_size: int
    local_rank: int


_current: TensorParallelGroup = SINGLE
_external: ExternalLaunch | None = None


def current_group() -> TensorParallelGroup:
    """The group of the model being built (SINGLE outside `building`)."""
    return _current


@contextlib.contextmanager
def building(group: TensorParallelGroup) -> Iterator[None]:
    """Build a model for `group`: its parallel layers take their rank, size and process group from it."""
    global _current
    previous, _current = _current, group
    try:
        yield
    finally:
        _current = previous


def set_external_launch(launch: ExternalLaunch | None) -> None:
    global _external
    _external = launch


def external_launch() -> ExternalLaunch | None:
    return _external


def backend_for(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


def init_tensor_parallel(rank: int, world_size: int, device: torch.device,
                         store: dist.Store | None = None) -> TensorParallelGroup:
    """Join (or, on rank 0, create) the default process group and return this rank's TensorParallelGroup.

    `store`: the rendezvous (a TCPStore the executor made); None: `env://` (torchrun's variables)."""
    if dist.is_initialized():
        raise RuntimeError("tensor_parallel_size: a tensor-parallel engine already runs in this process; "
                           "shut it down (LLM.shutdown()) before starting another")
    backend = backend_for(device.type)
    timeout = DEVICE_TIMEOUT if backend == "nccl" else CONTROL_TIMEOUT
    kwargs: dict[str, Any] = {"init_method": "env://"} if store is None else {"store": store}
    if device.type == "cuda":
        torch.cuda.set_device(device)
        kwargs["device_id"] = device  # NCCL communicators are created eagerly, before any CUDA graph capture
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout, **kwargs)
    _groups.device = dist.group.WORLD
    _groups.cpu = _groups.device if backend == "gloo" else dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    return TensorParallelGroup(rank, world_size)


def destroy_tensor_parallel() -> None:
    """Leave the default group (idempotent)."""
    _groups.device = _groups.cpu = None
    if dist.is_initialized():
        dist.destroy_process_group()


def abort_tensor_parallel() -> None:
    """Abort the process groups after a rank died: a collective blocked on the dead rank raises instead of
    waiting for its timeout (NCCL does not notice a dead peer by itself). Best effort."""
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort is not None and dist.is_initialized():
        with contextlib.suppress(Exception):
            abort()
