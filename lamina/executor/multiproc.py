"""MultiProcExecutor: tensor parallelism over torch.distributed. Rank 0 is the engine's own process (it
schedules, and runs its Worker in-process); ranks 1..N-1 are worker processes (lamina/executor/tp_worker.py):

    one node:     spawned here, one per device (torch.multiprocessing, spawn; lamina/executor/processes.py)
    several:      started by torchrun on every node (lamina/launch.py); they join through env://

Each step message is broadcast to every rank (over the gloo cpu group) before rank 0 runs its own share;
only rank 0's answer returns to the engine. Setup calls are broadcast too and their results gathered:
`determine_num_blocks` is the minimum over the ranks.

A worker that dies is an error, never a hang: rank 0 checks the workers before each broadcast, a collective
blocked on a dead rank fails (gloo: its sockets close; NCCL: the watcher thread aborts the group), and the
executor then raises WorkerDiedError naming the rank, its exit code and its traceback.
"""
from __future__ import annotations

import atexit
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from lamina.config import EngineConfig, ModelArch
from lamina.device import resolve_device
from lamina.distributed.communication import all_gather_objects, broadcast_object
from lamina.distributed.parallel_state import (TensorParallelGroup, abort_tensor_parallel, destroy_tensor_parallel,
                                               external_launch, init_tensor_parallel)
from lamina.executor.base import Executor, StepFuture
from lamina.executor.processes import WorkerProcesses
from lamina.executor.tp_worker import WorkerCall, WorkerSetup, rank_device
from lamina.failures import EngineBrokenError
from lamina.step import ModelRunnerOutput, SchedulerOutput
from lamina.worker.worker import Worker

logger = logging.getLogger(__name__)
T = TypeVar("T")

DEATH_GRACE_S = 5.0  # after a collective failed: how long to wait for the dead worker to be reaped


class WorkerDiedError(EngineBrokenError):
    """A tensor-parallel worker process died: the engine cannot go on."""


class MultiProcExecutor(Executor):
    def __init__(self, config: EngineConfig, arch: ModelArch) -> None:
        size = config.tensor_parallel_size
        device_type = resolve_device(config.device).type
        launch = external_launch()
        self.procs: WorkerProcesses | None = None
        self.group: TensorParallelGroup | None = None
        self._died: str | None = None
        self._nccl = device_type == "cuda"  # NCCL does not notice a dead peer: the watcher aborts it
        self._closed = False
        atexit.register(self.shutdown)  # workers are told to stop before the interpreter exits
        try:
            if launch is None:
                _check_devices(size, device_type)
                self.procs = WorkerProcesses()
                store = self.procs.start(size, device_type, self._on_death)
                device = rank_device(device_type, 0)
            else:
                if launch.world_size != size:
                    raise ValueError(f"tensor_parallel_size: {size}, but torchrun started {launch.world_size} "
                                     "processes (--nnodes x --nproc-per-node must equal tensor_parallel_size)")
                store, device = None, rank_device(device_type, launch.local_rank)
            self.group = init_tensor_parallel(0, size, device, store)
            logger.info("tensor parallelism: %d ranks on %s (%s)", size, device_type,
                        "torchrun" if launch else f"worker pids {self.procs.pids}")
            broadcast_object(WorkerSetup(config, arch), self.group)
            self.worker = Worker(config, arch, self.group, device)
            self._gather(lambda: None, "loading the model")
        except BaseException as err:
            death = self._death_after(err)
            self.shutdown()
            if death is not None:
                raise WorkerDiedError(f"tensor-parallel {death}") from err
            raise

    # ---- Executor -------------------------------------------------------------------------------------------

    def determine_num_blocks(self) -> int:
        return min(self._call("determine_num_blocks"))

    def initialize_cache(self, num_blocks: int) -> None:
        self._call("initialize_cache", num_blocks)

    @property
    def max_model_len(self) -> int:
        return self.worker.max_model_len

    def compile_and_capture(self, max_num_seqs: int) -> None:
        self._call("compile_and_capture", max_num_seqs)

    def execute_model(self, scheduler_output: SchedulerOutput) -> StepFuture:
        def launch() -> StepFuture:
            broadcast_object(scheduler_output, self.group)
            return _GuardedStep(self.worker.execute_model(scheduler_output), self)
        return self.guarded(launch, "running a step")

    def shutdown(self) -> None:
        """Tell the workers to exit, wait for them (then terminate / kill), leave the group. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        if self.group is not None and self._alive():
            try:
                broadcast_object(WorkerCall("shutdown"), self.group)
            except Exception as err:  # noqa: BLE001 - a dead worker cannot be told; stop() ends it anyway
                logger.warning("telling the tensor-parallel workers to stop failed: %r", err)
        if self.procs is not None:
            self.procs.stop()
        destroy_tensor_parallel()

    # ---- calls and failures ---------------------------------------------------------------------------------

    def _call(self, method: str, *args: Any) -> list[Any]:
        def own() -> Any:
            broadcast_object(WorkerCall(method, args), self.group)
            return getattr(self.worker, method)(*args)
        return self._gather(own, method)

    def _gather(self, own: Callable[[], Any], what: str) -> list[Any]:
        return self.guarded(lambda: all_gather_objects(own(), self.group), what)

    def guarded(self, fn: Callable[[], T], what: str) -> T:
        """Run `fn` (collectives with the workers); a dead worker becomes WorkerDiedError, not a hang."""
        if self._closed:
            raise EngineBrokenError("the tensor-parallel executor was shut down")
        if self._died is not None or (self.procs is not None and self.procs.death() is not None):
            raise WorkerDiedError(f"tensor-parallel {self._died or self.procs.death()} (before {what})")
        try:
            return fn()
        except Exception as err:
            death = self._death_after(err)
            if death is not None:
                raise WorkerDiedError(f"tensor-parallel {death} (while {what}): {err!r}") from err
            raise

    def _death_after(self, err: BaseException) -> str | None:
        """After a collective raised: the worker whose death explains it (waiting for it to be reaped)."""
        if self._died is not None:
            return self._died
        if self.procs is None or not isinstance(err, Exception):
            return None
        return self.procs.wait_for_death(DEATH_GRACE_S)

    def _alive(self) -> bool:
        return self._died is None and (self.procs is None or self.procs.death() is None)

    def _on_death(self, description: str) -> None:
        """The watcher thread saw a worker die: abort NCCL, so that a collective blocked on it raises."""
        self._died = description
        logger.error("tensor-parallel %s", description)
        if self._nccl:
            abort_tensor_parallel()


def _check_devices(size: int, device_type: str) -> None:
    if device_type == "cuda" and size > torch.cuda.device_count():
        raise ValueError(f"tensor_parallel_size: {size} ranks need {size} GPUs on this node, it has "
                         f"{torch.cuda.device_count()} (several nodes: torchrun, docs/distributed.md)")


class _GuardedStep:
    """Rank 0's PendingStep; reading it turns a dead worker into WorkerDiedError."""

    def __init__(self, pending: StepFuture, executor: MultiProcExecutor) -> None:
        self.pending = pending
        self.failed = pending.failed
        self.executor = executor

    def result(self) -> ModelRunnerOutput:
        return self.executor.guarded(self.pending.result, "reading a step")
