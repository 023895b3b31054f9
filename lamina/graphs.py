"""What every CUDA graph of lamina shares: batch-size buckets, the graph stand-ins, and the static buffers a flat
batch is copied into before a replay.

A graph for b rows of up to q tokens computes b * q token slots. A batch's T tokens are copied into the front;
padding rows n..b-1 get one token each, right after them; the slots left over belong to no row:

    token slot:     0 .. T-1 (the batch's)   T .. T+b-n-1 (padding rows)   .. b*q - 1 (no row)
    input_ids       the batch's tokens       0                              0
    positions       the batch's positions    0                              0
    slot_mapping    the batch's slots        -1 (store nothing)             -1
    row:            0 .. n-1 (real)          n .. b-1 (padding)
    seq_lens        the batch's seq lens     1    (attend to key 0 of block 0 only)
    block_tables    the batch's tables [:, :w]   0    (the null block)
    query_start_loc the batch's starts, then T+1, .., T+b-n   (q = 1: constant 0, 1, .., b)

A graph for tree drafts (q > 1) also carries TreeMask rows (lamina/attention/metadata.py): the batch's, or causal
ones for a batch without a tree; padding tokens see key 0.

The attention metadata a graph sees has constant host fields (max_query_len=q, max_seq_len=max_model_len,
b rows, each of 1 to q tokens: min_query_len=1), so the Triton backend routes and sizes its launches the same way
at capture and at every replay (q <= 8: the decode kernel, which reads each row's length from query_start_loc;
q > 8: the prefill kernel for the rows of more than 8 tokens and the decode kernel for the others, each skipping
the other's rows on the device); only device tensors change.
Slots of no row are computed (garbage, row-wise independent) and never read. `EagerGraph` stands in for
`torch.cuda.CUDAGraph` on CPU (capture = run once, replay = run again), so the buffer logic is tested without
a GPU.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np
import torch

from lamina.attention.metadata import AttentionMetadata, TreeMask


class FlatBatch(Protocol):
    """A flat batch on the host (lamina/worker/input_batch.py's HostBatch is one)."""

    input_ids: Sequence[int]
    positions: Sequence[int]
    slot_mapping: Sequence[int]
    query_start_loc: Sequence[int]
    seq_lens: Sequence[int]
    block_tables: Sequence[Sequence[int]]

    @property
    def num_seqs(self) -> int: ...


def graph_buckets(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8, up to and including max_batch_size."""
    small = [b for b in (1, 2, 4) if b < max_batch_size]
    return small + list(range(8, max_batch_size, 8)) + [max_batch_size]


def bucket_for(num_seqs: int, buckets: list[int]) -> int | None:
    """The smallest bucket that holds num_seqs rows; None when it is larger than every bucket."""
    return next((b for b in buckets if b >= num_seqs), None)


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
    """`torch.cuda.CUDAGraph` captured into a memory pool shared by every bucket.

    A replay reads the memory of every tensor the captured kernels read, so the graph keeps alive the tensors that
    its function closed over (`closed_over_tensors`: index tensors made before the capture, say), which would
    otherwise be freed with the function and their memory handed to other tensors (the tree draft loop's were: on
    the H200 its index kernels then read out of bounds). It keeps the tensors, not the function, which refers to
    its owner: owner -> graph -> function -> owner would be a reference cycle, never collected once the engine
    freezes the heap (lamina.engine.engine.freeze_heap)."""

    def __init__(self, pool: object = None) -> None:
        self.graph = torch.cuda.CUDAGraph()
        self.pool = pool
        self.inputs: list[torch.Tensor] = []

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        self.inputs = closed_over_tensors(fn)
        with torch.cuda.graph(self.graph, pool=self.pool):
            out = fn()
        return out

    def replay(self) -> None:
        self.graph.replay()


def closed_over_tensors(fn: Callable[..., object]) -> list[torch.Tensor]:
    """The tensors `fn` reaches through its closure: in its cells, in the functions, lists, tuples, dicts and
    dataclasses there (not other objects' attributes: an object keeps its own tensors)."""
    found, seen, todo = [], set(), [fn]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (list, tuple)):
            todo.extend(item)
        elif isinstance(item, dict):
            todo.extend(item.values())
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            todo.extend(getattr(item, f.name) for f in dataclasses.fields(item))
        elif callable(item) and getattr(item, "__closure__", None):
            todo.extend(cell.cell_contents for cell in item.__closure__ if _filled(cell))
    return found


def _filled(cell: object) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


@dataclass
class StaticBuffers:
    token_rows: torch.Tensor  # [3, N * q] int64: input_ids, positions, slot_mapping (one copy fills all three)
    seq_lens: torch.Tensor  # [N] int32
    query_start_loc: torch.Tensor  # [N + 1] int32 (q = 1: 0..N, constant)
    block_tables: torch.Tensor  # [N, max_blocks_per_seq] int32
    query_len: int = 1  # q: token slots per row
    tree_rows: torch.Tensor | None = None  # [2, N * q] int64: TreeMask's ctx and bits (tree drafts), else None

    @classmethod
    def allocate(cls, max_rows: int, max_blocks_per_seq: int, device: torch.device,
                 query_len: int = 1, tree: bool = False) -> StaticBuffers:
        token_rows = torch.zeros(3, max_rows * query_len, dtype=torch.int64, device=device)
        token_rows[2].fill_(-1)
        i32 = dict(dtype=torch.int32, device=device)
        tree_rows = torch.ones(2, max_rows * query_len, dtype=torch.int64, device=device) if tree else None
        return cls(token_rows=token_rows, seq_lens=torch.ones(max_rows, **i32),
                   query_start_loc=torch.arange(max_rows + 1, **i32),
                   block_tables=torch.zeros(max_rows, max_blocks_per_seq, **i32), query_len=query_len,
                   tree_rows=tree_rows)

    @property
    def input_ids(self) -> torch.Tensor:
        return self.token_rows[0]

    @property
    def positions(self) -> torch.Tensor:
        return self.token_rows[1]

    @property
    def slot_mapping(self) -> torch.Tensor:
        return self.token_rows[2]

    def fill(self, batch: FlatBatch, bucket: int) -> None:
        """Copy a batch of n rows (at most q tokens each) into the front and padding behind it (the module
        docstring's layout): three non-blocking copies from the host (ids / positions / slots, seq lens and
        query starts, block tables)."""
        num_tokens, pad_rows = len(batch.input_ids), bucket - batch.num_seqs
        rows = np.zeros((3, bucket * self.query_len), dtype=np.int64)  # lists or arrays alike, no list copies
        rows[0, :num_tokens], rows[1, :num_tokens] = batch.input_ids, batch.positions
        rows[2, :num_tokens], rows[2, num_tokens:] = batch.slot_mapping, -1
        self.token_rows[:, :bucket * self.query_len].copy_(torch.from_numpy(rows), non_blocking=True)
        lens = np.ones(bucket, dtype=np.int32)
        lens[:batch.num_seqs] = batch.seq_lens
        if self.query_len == 1:
            self.seq_lens[:bucket].copy_(torch.from_numpy(lens), non_blocking=True)
        else:
            host = np.empty(2 * bucket + 1, dtype=np.int32)  # seq lens, then query starts (padding rows: 1 token)
            host[:bucket], host[bucket:bucket + batch.num_seqs + 1] = lens, batch.query_start_loc
            host[bucket + batch.num_seqs + 1:] = np.arange(num_tokens + 1, num_tokens + pad_rows + 1)
            both = torch.from_numpy(host)
            self.seq_lens[:bucket].copy_(both[:bucket], non_blocking=True)
            self.query_start_loc[:bucket + 1].copy_(both[bucket:], non_blocking=True)
        tables = np.zeros((bucket, len(batch.block_tables[0])), dtype=np.int32)
        tables[:batch.num_seqs] = batch.block_tables
        # Entries past the batch's width are stale but never read: a row stops at its seq_len
        # (padding rows at 1: key 0 of block 0).
        self.block_tables[:bucket, :tables.shape[1]].copy_(torch.from_numpy(tables), non_blocking=True)
        if self.tree_rows is not None:
            self._fill_tree(batch, bucket)

    def _fill_tree(self, batch: FlatBatch, bucket: int) -> None:
        """TreeMask rows: the batch's tree_mask (HostBatch's), or causal rows (one past each token's key)."""
        rows, num_tokens = np.zeros((2, bucket * self.query_len), dtype=np.int64), len(batch.input_ids)
        rows[0] = 1  # padding and leftover slots: key 0
        tree = getattr(batch, "tree_mask", None)
        if tree is not None:
            rows[:, :num_tokens] = tree
        else:
            starts, lens = np.asarray(batch.query_start_loc), np.asarray(batch.seq_lens)
            counts = np.diff(starts)
            rows[0, :num_tokens] = np.repeat(lens - counts - starts[:-1], counts) + np.arange(num_tokens) + 1
        self.tree_rows[:, :bucket * self.query_len].copy_(torch.from_numpy(rows), non_blocking=True)

    def metadata(self, bucket: int, max_model_len: int) -> AttentionMetadata:
        """Views of the first `bucket` rows, with host fields that are the same at every replay (the host query
        starts say q tokens a row: only the torch reference backend would read them, and it is never
        captured; the kernels' routing reads min_query_len)."""
        q = self.query_len
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:bucket * q], query_start_loc=self.query_start_loc[:bucket + 1],
            seq_lens=self.seq_lens[:bucket], block_tables=self.block_tables[:bucket],
            max_query_len=q, max_seq_len=max_model_len,
            query_start_loc_cpu=list(range(0, bucket * q + 1, q)), seq_lens_cpu=[max_model_len] * bucket,
            min_query_len=1,
            tree_mask=None if self.tree_rows is None else TreeMask(self.tree_rows[0, :bucket * q],
                                                                   self.tree_rows[1, :bucket * q], [], []))


def graph_pool(graph_cls: type) -> object:
    """One memory pool for a set of graphs captured largest first (the smaller ones reuse its memory)."""
    return torch.cuda.graph_pool_handle() if graph_cls is TorchCUDAGraph else None


def capture(fn: Callable[[], torch.Tensor], graph_cls: type, pool: object,
            device: torch.device) -> tuple[Graph, torch.Tensor]:
    """Run `fn` once outside a graph (Triton compiles, the allocator settles), then capture it: (graph, output)."""
    fn()
    _synchronize(device)
    graph = graph_cls(pool)
    output = graph.capture(fn)
    _synchronize(device)
    return graph, output


def capture_buckets(fn_for: Callable[[int], Callable[[], torch.Tensor]], buckets: Sequence[int], graph_cls: type,
                    device: torch.device) -> tuple[dict[int, Graph], dict[int, torch.Tensor]]:
    """`capture` of fn_for(bucket) for every bucket, largest first, in one memory pool: (graphs, outputs) by
    bucket."""
    pool = graph_pool(graph_cls)
    graphs, outputs = {}, {}
    for bucket in reversed(buckets):
        graphs[bucket], outputs[bucket] = capture(fn_for(bucket), graph_cls, pool, device)
    return graphs, outputs


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
