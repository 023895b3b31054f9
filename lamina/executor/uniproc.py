"""UniProcExecutor: one worker in the engine's own process; a step is a method call, its future the
worker's PendingStep (async scheduling overlaps the device's work with the host's, as before)."""
from __future__ import annotations

from lamina.config import EngineConfig, ModelArch
from lamina.executor.base import Executor, StepFuture
from lamina.step import SchedulerOutput
from lamina.worker.worker import Worker


class UniProcExecutor(Executor):
    def __init__(self, config: EngineConfig, arch: ModelArch) -> None:
        self.worker = Worker(config, arch)

    def determine_num_blocks(self) -> int:
        return self.worker.determine_num_blocks()

    def initialize_cache(self, num_blocks: int) -> None:
        self.worker.initialize_cache(num_blocks)

    @property
    def max_model_len(self) -> int:
        return self.worker.max_model_len

    def compile_and_capture(self, max_num_seqs: int) -> None:
        self.worker.compile_and_capture(max_num_seqs)

    def execute_model(self, scheduler_output: SchedulerOutput) -> StepFuture:
        return self.worker.execute_model(scheduler_output)

    def shutdown(self) -> None:
        """Nothing to stop: the worker lives and dies with this process."""
