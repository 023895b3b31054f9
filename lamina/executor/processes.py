"""The worker processes of a one-node tensor-parallel engine: started with torch.multiprocessing (spawn), one
per device, watched, stopped.

    start(size, device_type)  a TCPStore on 127.0.0.1 (rank 0's rendezvous), ranks 1..size-1 spawned; returns
                              once every rank has joined, or raises naming the rank that died first
    death()                   "worker rank 1 (pid 123) died: exit code -9" (+ its traceback), or None
    wait_for_death(s)         the same, waiting up to s seconds for a dying worker to be reaped
    stop(timeout)             join, then terminate, then kill: no process outlives the engine

A watcher thread reports the first death to `on_death` (the executor aborts NCCL there: a collective blocked
on a dead rank would otherwise wait for its timeout; gloo raises by itself once the dead rank's sockets close).
"""
from __future__ import annotations

import datetime
import multiprocessing.connection
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from lamina.distributed.parallel_state import CONTROL_TIMEOUT

STARTUP_TIMEOUT_S = 600.0  # a worker that has not joined the group after this long (importing torch) is stuck
JOINED_KEY = "lamina/joined/{rank}"


@dataclass
class _Child:
    rank: int
    process: Any  # a spawn-context Process
    errors: multiprocessing.connection.Connection  # the worker's traceback, if it fails


class WorkerProcesses:
    def __init__(self) -> None:
        self.children: list[_Child] = []
        self.store: dist.TCPStore | None = None
        self._stopping = False
        self._error_text: dict[int, str] = {}

    def start(self, size: int, device_type: str, on_death: Callable[[str], None] | None = None) -> dist.TCPStore:
        from lamina.executor.tp_worker import spawned_worker_main  # the spawned processes' entry point

        self.store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False,
                                   timeout=CONTROL_TIMEOUT)
        ctx = mp.get_context("spawn")
        for rank in range(1, size):
            receiver, sender = ctx.Pipe(duplex=False)
            process = ctx.Process(target=spawned_worker_main, name=f"lamina-tp-rank{rank}", daemon=True,
                                  args=(rank, size, "127.0.0.1", self.store.port, device_type, sender))
            process.start()
            sender.close()
            self.children.append(_Child(rank, process, receiver))
        self._wait_joined()
        if on_death is not None:
            threading.Thread(target=self._watch, args=(on_death,), name="lamina-tp-watch", daemon=True).start()
        return self.store

    def _wait_joined(self) -> None:
        keys = [JOINED_KEY.format(rank=c.rank) for c in self.children]
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self.store.check(keys):
            death = self.death()
            if death is not None:
                raise RuntimeError(f"tensor-parallel {death} while starting")
            if time.monotonic() > deadline:
                raise RuntimeError(f"tensor-parallel workers did not join within {STARTUP_TIMEOUT_S:.0f} s")
            time.sleep(0.05)

    def _watch(self, on_death: Callable[[str], None]) -> None:
        self._reap(multiprocessing.connection.wait([c.process.sentinel for c in self.children]))
        if not self._stopping:
            on_death(self.death() or "a worker died")

    def _reap(self, ready: list[Any], timeout: float = 5.0) -> None:
        """Join the workers whose sentinels fired: their exit codes are known once they are reaped."""
        for child in self.children:
            if child.process.sentinel in ready:
                child.process.join(timeout)

    def death(self) -> str | None:
        """The first dead worker, described (exit code, and its traceback when it sent one)."""
        for child in self.children:
            code = child.process.exitcode
            if code is None:
                continue
            text = self._traceback(child)
            detail = f"\n--- worker rank {child.rank} traceback ---\n{text}" if text else ""
            return f"worker rank {child.rank} (pid {child.process.pid}) died: exit code {code}{detail}"
        return None

    def _traceback(self, child: _Child) -> str:
        if child.rank not in self._error_text:
            text = ""
            try:
                if child.errors.poll(0.2):
                    text = str(child.errors.recv())
            except (EOFError, OSError):
                pass
            self._error_text[child.rank] = text
        return self._error_text[child.rank]

    def wait_for_death(self, timeout: float) -> str | None:
        """A worker's death, waiting up to `timeout` s for it to be reaped (a collective fails first)."""
        deadline = time.monotonic() + timeout
        while True:  # polled: the watcher thread may be reaping the same process (waitpid in two threads)
            death = self.death()
            if death is not None or time.monotonic() > deadline:
                return death
            time.sleep(0.02)

    def stop(self, timeout: float = 10.0) -> None:
        """Wait for the workers to exit (they were told to), then terminate and kill what is left."""
        self._stopping = True
        deadline = time.monotonic() + timeout
        for child in self.children:
            child.process.join(max(0.0, deadline - time.monotonic()))
        for child in self.children:
            if child.process.is_alive():
                child.process.terminate()
                child.process.join(2.0)
            if child.process.is_alive():
                child.process.kill()
                child.process.join(2.0)
            child.errors.close()

    @property
    def pids(self) -> list[int]:
        return [c.process.pid for c in self.children]


def joined(store: dist.Store, rank: int) -> None:
    """A spawned worker tells rank 0 it is up (before it blocks in init_process_group)."""
    store.set(JOINED_KEY.format(rank=rank), "1")


def connect(host: str, port: int, world_size: int) -> dist.TCPStore:
    return dist.TCPStore(host, port, world_size, is_master=False, timeout=datetime.timedelta(minutes=10))
