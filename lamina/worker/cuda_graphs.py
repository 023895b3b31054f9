"""CUDA graphs for decode and verify steps: one graph per (query length, batch-size bucket), replayed on static
buffers.

A batch of n rows whose longest row has q_max tokens runs in the graph of the smallest captured query length
q >= q_max (1: plain decode; 1 + k: speculative verification, captured when drafting) and the smallest bucket
b >= n. The graph computes b * q token slots. The batch's T tokens are copied into the front; padding rows
n..b-1 get one token each, right after them; the slots left over belong to no row:

    token slot:     0 .. T-1 (the batch's)   T .. T+b-n-1 (padding rows)   .. b*q - 1 (no row)
    input_ids       the batch's tokens       0                              0
    positions       the batch's positions    0                              0
    slot_mapping    the batch's slots        -1 (store nothing)             -1
    row:            0 .. n-1 (real)          n .. b-1 (padding)
    seq_lens        the batch's seq lens     1    (attend to key 0 of block 0 only)
    block_tables    the batch's tables [:, :w]   0    (the null block)
    query_start_loc the batch's starts, then T+1, .., T+b-n   (q = 1: constant 0, 1, .., b)

The attention metadata a graph sees has constant host fields (max_query_len=q, max_seq_len=max_model_len,
b rows), so the Triton backend routes and sizes its launches the same way at capture and at every replay
(q <= 8: the decode kernel, which reads each row's length from query_start_loc); only device tensors change.
Slots of no row are computed (garbage, row-wise independent) and never read. Logits and sampling run outside
the graph on the batch's rows. `EagerGraph` stands in for `torch.cuda.CUDAGraph` on CPU (capture = run once,
replay = run again), so the buffer logic is tested without a GPU.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
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
    token_rows: torch.Tensor  # [3, N * q] int64: input_ids, positions, slot_mapping (one copy fills all three)
    seq_lens: torch.Tensor  # [N] int32
    query_start_loc: torch.Tensor  # [N + 1] int32 (q = 1: 0..N, constant)
    block_tables: torch.Tensor  # [N, max_blocks_per_seq] int32
    query_len: int = 1  # q: token slots per row

    @classmethod
    def allocate(cls, max_rows: int, max_blocks_per_seq: int, device: torch.device,
                 query_len: int = 1) -> StaticBuffers:
        token_rows = torch.zeros(3, max_rows * query_len, dtype=torch.int64, device=device)
        token_rows[2].fill_(-1)
        i32 = dict(dtype=torch.int32, device=device)
        return cls(token_rows=token_rows, seq_lens=torch.ones(max_rows, **i32),
                   query_start_loc=torch.arange(max_rows + 1, **i32),
                   block_tables=torch.zeros(max_rows, max_blocks_per_seq, **i32), query_len=query_len)

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
        """Copy a batch of n rows (at most q tokens each) into the front and padding behind it (the module
        docstring's layout): three non-blocking copies from the host (ids / positions / slots, seq lens and
        query starts, block tables)."""
        num_tokens, pad_rows = len(batch.input_ids), bucket - batch.num_seqs
        pad = bucket * self.query_len - num_tokens
        rows = np.array([batch.input_ids + [0] * pad, batch.positions + [0] * pad,
                         batch.slot_mapping + [-1] * pad], dtype=np.int64)
        self.token_rows[:, :bucket * self.query_len].copy_(torch.from_numpy(rows), non_blocking=True)
        lens = batch.seq_lens + [1] * pad_rows
        if self.query_len == 1:
            self.seq_lens[:bucket].copy_(torch.from_numpy(np.array(lens, dtype=np.int32)), non_blocking=True)
        else:
            starts = batch.query_start_loc + list(range(num_tokens + 1, num_tokens + pad_rows + 1))
            both = torch.from_numpy(np.array(lens + starts, dtype=np.int32))
            self.seq_lens[:bucket].copy_(both[:bucket], non_blocking=True)
            self.query_start_loc[:bucket + 1].copy_(both[bucket:], non_blocking=True)
        tables = np.zeros((bucket, len(batch.block_tables[0])), dtype=np.int32)
        tables[:batch.num_seqs] = batch.block_tables
        # Entries past the batch's width are stale but never read: a row stops at its seq_len
        # (padding rows at 1: key 0 of block 0).
        self.block_tables[:bucket, :tables.shape[1]].copy_(torch.from_numpy(tables), non_blocking=True)

    def metadata(self, bucket: int, max_model_len: int) -> AttentionMetadata:
        """Views of the first `bucket` rows, with host fields that are the same at every replay (the host query
        starts say q tokens a row: only the torch reference backend would read them, and it is never
        captured)."""
        q = self.query_len
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:bucket * q], query_start_loc=self.query_start_loc[:bucket + 1],
            seq_lens=self.seq_lens[:bucket], block_tables=self.block_tables[:bucket],
            max_query_len=q, max_seq_len=max_model_len,
            query_start_loc_cpu=list(range(0, bucket * q + 1, q)), seq_lens_cpu=[max_model_len] * bucket)


@dataclass
class GraphSet:
    """The graphs of one query length q: one per bucket, over one set of static buffers."""

    buffers: StaticBuffers
    graphs: dict[int, Graph] = field(default_factory=dict)
    outputs: dict[int, torch.Tensor] = field(default_factory=dict)


class CudaGraphRunner:
    """Captures the model's forward per (query length, bucket) and replays it for batches that fit."""

    def __init__(self, model: torch.nn.Module, max_batch_size: int, max_model_len: int, block_size: int,
                 device: torch.device, graph_cls: type = TorchCUDAGraph, query_lens: tuple[int, ...] = (1,)) -> None:
        self.model = model
        self.buckets = graph_buckets(max_batch_size)
        self.max_model_len = max_model_len
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.device = device
        self.graph_cls = graph_cls
        self.sets = {q: GraphSet(StaticBuffers.allocate(self.buckets[-1], self.max_blocks_per_seq, device, q))
                     for q in sorted(set(query_lens))}

    @property
    def graphs(self) -> dict[int, Graph]:
        """The plain decode graphs (q = 1), by bucket."""
        return self.sets[1].graphs if 1 in self.sets else {}

    @torch.inference_mode()
    def capture_all(self) -> None:
        """Longest rows and largest bucket first, all in one memory pool (smaller graphs reuse the largest
        one's memory)."""
        pool = torch.cuda.graph_pool_handle() if self.graph_cls is TorchCUDAGraph else None
        for graph_set in reversed(self.sets.values()):
            for bucket in reversed(self.buckets):
                forward = self._forward_fn(graph_set.buffers, bucket)
                forward()  # warm-up outside the graph: Triton compiles, allocator settles
                self._synchronize()
                graph = self.graph_cls(pool)
                graph_set.outputs[bucket] = graph.capture(forward)
                graph_set.graphs[bucket] = graph
                self._synchronize()
        logger.info("captured %d CUDA graphs (query lengths %s) for batches of up to %d sequences",
                    len(self.buckets) * len(self.sets), list(self.sets), self.buckets[-1])

    def _forward_fn(self, buffers: StaticBuffers, bucket: int) -> Callable[[], torch.Tensor]:
        metadata = buffers.metadata(bucket, self.max_model_len)
        num_tokens = bucket * buffers.query_len
        ids, pos = buffers.input_ids[:num_tokens], buffers.positions[:num_tokens]

        def forward() -> torch.Tensor:
            with set_attention_metadata(metadata):
                return self.model(ids, pos)
        return forward

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _set_for(self, batch: HostBatch) -> GraphSet | None:
        """The captured set of the shortest query length that holds the batch's longest row."""
        if batch.num_seqs > self.buckets[-1] or len(batch.block_tables[0]) > self.max_blocks_per_seq:
            return None
        longest = batch.max_query_len
        return next((s for q, s in self.sets.items() if q >= longest and s.graphs), None)

    def can_run(self, batch: HostBatch) -> bool:
        return self._set_for(batch) is not None

    def run(self, batch: HostBatch, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states [T, hidden] of the batch's T tokens (a view of the graph's output: use it before the
        next replay). `input_ids` [T], on the device, replace the batch's."""
        graph_set = self._set_for(batch)
        bucket = bucket_for(batch.num_seqs, self.buckets)
        graph_set.buffers.fill(batch, bucket)
        num_tokens = len(batch.input_ids)
        if input_ids is not None:
            graph_set.buffers.input_ids[:num_tokens].copy_(input_ids)
        graph_set.graphs[bucket].replay()
        return graph_set.outputs[bucket][:num_tokens]
