"""Executor: the engine's one handle on its worker(s). The engine sends each step message through it and
gets a future of the workers' answer; it never touches a worker, a model or a tensor.

    engine ──SchedulerOutput──> Executor.execute_model ──> worker(s) ──> StepFuture.result() -> ModelRunnerOutput

`UniProcExecutor` (uniproc.py) runs one worker in the engine's process. A multi-process executor (tensor
parallelism) implements the same interface: it broadcasts the message to every rank and answers with
rank 0's output; its `determine_num_blocks` is the minimum over the ranks.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

from lamina.step import ModelRunnerOutput, SchedulerOutput


class StepFuture(Protocol):
    """A launched step. `failed` (request id -> error: rows whose sampling raised) is known at launch."""

    failed: dict[str, str]

    def result(self) -> ModelRunnerOutput: ...


class Executor(ABC):
    @abstractmethod
    def determine_num_blocks(self) -> int:
        """KV blocks every worker can hold (the minimum over workers)."""

    @abstractmethod
    def initialize_cache(self, num_blocks: int) -> None:
        """Allocate `num_blocks` KV blocks on every worker."""

    @property
    @abstractmethod
    def max_model_len(self) -> int:
        """The longest sequence the workers' KV caches and the model allow (after initialize_cache)."""

    @abstractmethod
    def compile_and_capture(self, max_num_seqs: int) -> None:
        """Compile kernels and capture decode graphs for batches of up to max_num_seqs."""

    @abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput) -> StepFuture:
        """Launch one step; the future's result() waits for its tokens. Steps run in launch order."""

    @abstractmethod
    def shutdown(self) -> None:
        """Release the workers (idempotent)."""
