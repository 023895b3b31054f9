"""CUDA graphs for decode-only steps: one graph per batch-size bucket, replayed on static buffers.

A decode-only batch (every request schedules exactly 1 token) of n rows runs in the graph of the
smallest bucket b >= n. Its rows are copied into the front of static buffers; rows n..b-1 are
padding that stores nothing and attends to the (zeroed) null block:

    row:            0 .. n-1 (real)              n .. b-1 (padding)
    input_ids       the batch's tokens           0
    positions       the batch's positions        0
    slot_mapping    the batch's slots            -1   (store nothing)
    seq_lens        the batch's seq lens         1    (attend to key 0 of block 0 only)
    block_tables    the batch's tables [:, :w]   0    (the null block)
    query_start_loc 0, 1, .., b                  (constant: one query token per row)

The attention metadata a graph sees has constant host fields (max_query_len=1,
max_seq_len=max_model_len, b rows), so the Triton backend routes and sizes its launches the same
way at capture and at every replay; only device tensors change. Logits and sampling run outside
the graph on the first n rows of the output. `EagerGraph` stands in for `torch.cuda.CUDAGraph` on
CPU (capture = run once, replay = run again), so the buffer logic is tested without a GPU.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np
import torch

from lamina.attention.metadata import AttentionMetadata, set_attention_metadata
from lamina.worker.input_batch import HostBatch

logger = logging.getLogger(__name__)


def graph_buckets(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8, up to and including max_batch_size."""
    small = [b for b in (1, 2, 4) if b < max_batch_size]
    return small + list(range(8, max_batch_size, 8)) + [max_batch_size]


def bucket_for(num_seqs: int, buckets: list[int]) -> int | None:
    """The smallest bucket that holds num_seqs rows; None when it is larger than every bucket."""
    return next((b for b in buckets if b >= num_seqs), None)


def graph_decision(device: torch.device, enforce_eager: bool, backend_name: str, kernels_supported: bool,
                   ) -> tuple[bool, str]:
    """(capture?, why): graphs only on CUDA, with the Triton kernels, unless enforce_eager."""
    if device.type != "cuda":
        return False, f"eager: device is {device.type}"
    if enforce_eager:
        return False, "eager: enforce_eager=True"
    if backend_name != "triton":
        return False, f"eager: the {backend_name} attention backend reads host metadata (not capturable)"
    if not kernels_supported:
        return False, "eager: the triton backend falls back to the torch reference for this head_dim / dtype"
    return True, "CUDA graphs for decode batches"


class Graph(Protocol):
    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor: ...

    def replay(self) -> None: ...


class EagerGraph:
    """A stand-in for a CUDA graph: capture runs `fn` once, replay runs it again into the same output."""

    def __init__(self, pool: object = None) -> None:
        self._fn: Callable[[], torch.Tensor] | None = None
        self._out: torch.Tensor | None = None

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        self._fn, self._out = fn, fn()
        return self._out

    def replay(self) -> None:
        self._out.copy_(self._fn())


class TorchCUDAGraph:
    """`torch.cuda.CUDAGraph` captured into a memory pool shared by every bucket."""

    def __init__(self, pool: object = None) -> None:
        self.graph = torch.cuda.CUDAGraph()
        self.pool = pool

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        with torch.cuda.graph(self.graph, pool=self.pool):
            out = fn()
        return out

    def replay(self) -> None:
        self.graph.replay()


@dataclass
class StaticBuffers:
    token_rows: torch.Tensor  # [3, N] int64: input_ids, positions, slot_mapping (one copy fills all three)
    seq_lens: torch.Tensor  # [N] int32
    query_start_loc: torch.Tensor  # [N + 1] int32, 0..N
    block_tables: torch.Tensor  # [N, max_blocks_per_seq] int32

    @classmethod
    def allocate(cls, max_rows: int, max_blocks_per_seq: int, device: torch.device) -> StaticBuffers:
        token_rows = torch.zeros(3, max_rows, dtype=torch.int64, device=device)
        token_rows[2].fill_(-1)
        i32 = dict(dtype=torch.int32, device=device)
        return cls(token_rows=token_rows, seq_lens=torch.ones(max_rows, **i32),
                   query_start_loc=torch.arange(max_rows + 1, **i32),
                   block_tables=torch.zeros(max_rows, max_blocks_per_seq, **i32))

    @property
    def input_ids(self) -> torch.Tensor:
        return self.token_rows[0]

    @property
    def positions(self) -> torch.Tensor:
        return self.token_rows[1]

    @property
    def slot_mapping(self) -> torch.Tensor:
        return self.token_rows[2]

    def fill(self, batch: HostBatch, bucket: int) -> None:
        """Copy a decode batch of n rows into rows [0, n) and padding into rows [n, bucket): three
        non-blocking copies from the host (ids / positions / slots, seq lens, block tables)."""
        pad = bucket - batch.num_seqs
        rows = np.array([batch.input_ids + [0] * pad, batch.positions + [0] * pad,
                         batch.slot_mapping + [-1] * pad], dtype=np.int64)
        self.token_rows[:, :bucket].copy_(torch.from_numpy(rows), non_blocking=True)
        seq_lens = np.array(batch.seq_lens + [1] * pad, dtype=np.int32)
        self.seq_lens[:bucket].copy_(torch.from_numpy(seq_lens), non_blocking=True)
        tables = np.zeros((bucket, len(batch.block_tables[0])), dtype=np.int32)
        tables[:batch.num_seqs] = batch.block_tables
        # Entries past the batch's width are stale but never read: a row stops at its seq_len
        # (padding rows at 1: key 0 of block 0).
        self.block_tables[:bucket, :tables.shape[1]].copy_(torch.from_numpy(tables), non_blocking=True)

    def metadata(self, bucket: int, max_model_len: int) -> AttentionMetadata:
        """Views of the first `bucket` rows, with host fields that are the same at every replay."""
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:bucket], query_start_loc=self.query_start_loc[:bucket + 1],
            seq_lens=self.seq_lens[:bucket], block_tables=self.block_tables[:bucket],
            max_query_len=1, max_seq_len=max_model_len,
            query_start_loc_cpu=list(range(bucket + 1)), seq_lens_cpu=[max_model_len] * bucket)


class CudaGraphRunner:
    """Captures the model's forward per bucket and replays it for decode-only batches."""

    def __init__(self, model: torch.nn.Module, max_batch_size: int, max_model_len: int, block_size: int,
                 device: torch.device, graph_cls: type = TorchCUDAGraph) -> None:
        self.model = model
        self.buckets = graph_buckets(max_batch_size)
        self.max_model_len = max_model_len
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.device = device
        self.graph_cls = graph_cls
        self.buffers = StaticBuffers.allocate(self.buckets[-1], self.max_blocks_per_seq, device)
        self.graphs: dict[int, Graph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    @torch.inference_mode()
    def capture_all(self) -> None:
        """Largest bucket first, all in one memory pool (smaller graphs reuse the largest one's memory)."""
        pool = torch.cuda.graph_pool_handle() if self.graph_cls is TorchCUDAGraph else None
        for bucket in reversed(self.buckets):
            forward = self._forward_fn(bucket)
            forward()  # warm-up outside the graph: Triton compiles, allocator settles
            self._synchronize()
            graph = self.graph_cls(pool)
            self.outputs[bucket] = graph.capture(forward)
            self.graphs[bucket] = graph
            self._synchronize()
        logger.info("captured %d CUDA graphs for decode batches of up to %d sequences", len(self.buckets),
                    self.buckets[-1])

    def _forward_fn(self, bucket: int) -> Callable[[], torch.Tensor]:
        metadata = self.buffers.metadata(bucket, self.max_model_len)
        ids, pos = self.buffers.input_ids[:bucket], self.buffers.positions[:bucket]

        def forward() -> torch.Tensor:
            with set_attention_metadata(metadata):
                return self.model(ids, pos)
        return forward

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def can_run(self, batch: HostBatch) -> bool:
        return (bool(self.graphs) and batch.is_decode_only and batch.num_seqs <= self.buckets[-1]
                and len(batch.block_tables[0]) <= self.max_blocks_per_seq)

    def run(self, batch: HostBatch, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states [n, hidden] of a decode-only batch (a view of the graph's output: use it
        before the next replay). `input_ids` [n], on the device, replace the batch's."""
        n = batch.num_seqs
        bucket = bucket_for(n, self.buckets)
        self.buffers.fill(batch, bucket)
        if input_ids is not None:
            self.buffers.input_ids[:n].copy_(input_ids)
        self.graphs[bucket].replay()
        return self.outputs[bucket][:n]
