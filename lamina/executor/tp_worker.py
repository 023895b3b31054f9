"""The ranks 1..N-1 of a tensor-parallel engine: a Worker that does what rank 0's executor broadcasts.

    rank 0 (engine process, lamina/executor/multiproc.py)      rank r >= 1 (this module)
    -----------------------------------------------------      ---------------------------------------------
    broadcast WorkerSetup(config, arch); build its Worker       receive it; build its Worker (its shard)
    broadcast WorkerCall(m, args); run m; all_gather results    receive; run m; all_gather its result
    broadcast a SchedulerOutput; run the step                   receive; run the step (StepMirror)
    broadcast WorkerCall("shutdown")                            leave the loop, leave the group, exit

Every rank runs every step in full, sampling included, with the same seeds: all ranks sample the same tokens
and keep the same copies of the requests; only rank 0's answer goes back to the engine.

A worker started by lamina (`spawned_worker_main`) sends its traceback to rank 0 and exits non-zero when it
fails; a worker under torchrun (`run_external_worker`, from lamina/launch.py) just exits non-zero.
"""
from __future__ import annotations

import logging
import os
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

from lamina.config import EngineConfig, ModelArch
from lamina.distributed.communication import all_gather_objects, broadcast_object
from lamina.distributed.parallel_state import (ExternalLaunch, TensorParallelGroup, destroy_tensor_parallel,
                                               init_tensor_parallel)
from lamina.failures import is_fatal
from lamina.step import SchedulerOutput
from lamina.worker.pending_step import PendingStep
from lamina.worker.worker import Worker

logger = logging.getLogger(__name__)

SETUP_METHODS = ("determine_num_blocks", "initialize_cache", "compile_and_capture")


@dataclass(frozen=True)
class WorkerSetup:
    """The first message: what to build."""

    config: EngineConfig
    arch: ModelArch


@dataclass(frozen=True)
class WorkerCall:
    """A setup call (one of SETUP_METHODS, whose results rank 0 gathers), or "shutdown"."""

    method: str
    args: tuple[Any, ...] = field(default_factory=tuple)


def rank_device(device_type: str, local_rank: int) -> torch.device:
    """cuda:local_rank on GPUs, the CPU otherwise."""
    return torch.device("cuda", local_rank) if device_type == "cuda" else torch.device("cpu")


class StepMirror:
    """Runs the broadcast steps in rank 0's order of launches and reads. Rank 0 reads a step's tokens before
    it launches the next step, except for a decode_ahead step, which it launches first (the engine's async
    scheduling); a worker does the same, so its copies of the requests get the same tokens at the same time."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.pending: PendingStep | None = None

    def step(self, scheduled: SchedulerOutput) -> None:
        if scheduled.decode_ahead:
            launched = self._guard(lambda: self.worker.execute_model(scheduled))
            self.read()
            self.pending = launched
        else:
            self.read()
            self.pending = self._guard(lambda: self.worker.execute_model(scheduled))

    def read(self) -> None:
        pending, self.pending = self.pending, None
        if pending is not None:
            self._guard(pending.result)

    @staticmethod
    def _guard(fn: Any) -> Any:
        """A step that raises here raised on rank 0 too (the same computation): its requests fail there and
        the engine goes on, so this rank goes on. A fatal error ends the worker."""
        try:
            return fn()
        except Exception as err:  # noqa: BLE001 - mirrors the engine's handling of a failed step
            if is_fatal(err):
                raise
            logger.warning("a step failed on this rank too: %r", err)
            return None


def serve(group: TensorParallelGroup, device: torch.device) -> None:
    """Build the worker rank 0 describes, then run its calls and steps until it says shutdown."""
    setup: WorkerSetup = broadcast_object(None, group)
    worker = Worker(setup.config, setup.arch, group, device)
    all_gather_objects(None, group)  # loaded
    mirror = StepMirror(worker)
    while True:
        message = broadcast_object(None, group)
        if isinstance(message, SchedulerOutput):
            mirror.step(message)
            continue
        mirror.read()
        if message.method == "shutdown":
            return
        if message.method not in SETUP_METHODS:
            raise RuntimeError(f"unknown worker call {message.method!r}")
        all_gather_objects(getattr(worker, message.method)(*message.args), group)


def spawned_worker_main(rank: int, world_size: int, host: str, port: int, device_type: str, errors: Any) -> None:
    """Entry point of a worker process lamina spawned (lamina/executor/processes.py)."""
    from lamina.executor.processes import connect, joined

    logging.basicConfig(level=logging.WARNING, format=f"[tp rank {rank}] %(levelname)s %(name)s: %(message)s")
    code = 0
    try:
        if device_type == "cpu":  # the ranks share the host's cores
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        device = rank_device(device_type, rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)  # a device that cannot be used fails here, before joining
        store = connect(host, port, world_size)
        joined(store, rank)
        serve(init_tensor_parallel(rank, world_size, device, store), device)
    except BaseException:  # noqa: BLE001 - whatever ends the worker goes to rank 0, which raises it
        code = 1
        try:
            errors.send(traceback.format_exc())
        except OSError:
            pass
    finally:
        destroy_tensor_parallel()
    sys.exit(code)


def run_external_worker(launch: ExternalLaunch) -> int:
    """A rank >= 1 started by torchrun: join through env://, serve rank 0, exit status 0 after shutdown."""
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    device = rank_device(device_type, launch.local_rank)
    try:
        serve(init_tensor_parallel(launch.rank, launch.world_size, device), device)
    finally:
        destroy_tensor_parallel()
    return 0
