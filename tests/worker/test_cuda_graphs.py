"""CUDA graphs, the parts that need no model: buckets, what a captured function keeps alive, padding into static
buffers and the capture decision. Replayed steps against eager ones: test_cuda_graphs_replay.py."""
from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Callable

import pytest
import torch

from lamina.graphs import (StaticBuffers, TorchCUDAGraph, bucket_for, capture_buckets, closed_over_tensors,
                           graph_buckets)
from lamina.worker.cuda_graphs import graph_decision
from lamina.worker.input_batch import HostBatch

CUDA = torch.device("cuda")  # a device object only: nothing is allocated on it


def test_buckets() -> None:
    assert graph_buckets(256)[:6] == [1, 2, 4, 8, 16, 24] and graph_buckets(256)[-1] == 256
    assert graph_buckets(1) == [1] and graph_buckets(8) == [1, 2, 4, 8] and graph_buckets(10) == [1, 2, 4, 8, 10]
    buckets = graph_buckets(40)
    assert [bucket_for(n, buckets) for n in (1, 3, 5, 9, 33, 40, 41)] == [1, 4, 8, 16, 40, 40, None]


def test_a_captured_graph_keeps_the_tensors_its_function_closed_over_and_no_cycle(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA graph's replays read the memory its kernels read when captured: a tensor that only the captured
    function holds (the tree draft loop's index tensors, made before the capture) must live as long as the graph,
    or the allocator hands its memory to another tensor (on the H200: an index kernel out of bounds). The graph must
    not hold the function itself, which refers to the graphs' owner: that cycle would outlive a dropped engine
    once the heap is frozen. torch.cuda's graph and its capture context stand in here, on the CPU."""
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, pool=None: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)

    class Owner:  # holds its graphs; its captured functions refer to it
        def __init__(self) -> None:
            self.made: list[weakref.ref] = []
            self.graphs, self.outputs = capture_buckets(self.fn_for, [1, 4], TorchCUDAGraph, torch.device("cpu"))

        def fn_for(self, bucket: int) -> Callable[[], torch.Tensor]:
            held = {"rows": [torch.arange(bucket)]}  # only the closure holds it, in a dict, in a list
            self.made.append(weakref.ref(held["rows"][0]))
            return lambda: self.double(held["rows"][0])

        @staticmethod
        def double(t: torch.Tensor) -> torch.Tensor:
            return t * 2

    gc.disable()  # reference counts alone: what a frozen heap leaves
    try:
        owner = Owner()
        made, alive = owner.made, weakref.ref(owner)
        gc.collect()
        assert len(made) == 2 and all(ref() is not None for ref in made)
        assert owner.outputs[4].tolist() == [0, 2, 4, 6]
        del owner
        assert alive() is None and all(ref() is None for ref in made)
    finally:
        gc.enable()


def test_closed_over_tensors_walks_cells_functions_containers_and_dataclasses() -> None:
    a, b, c, d = (torch.zeros(n) for n in range(1, 5))
    meta = StaticBuffers(token_rows=c, seq_lens=d, query_start_loc=d, block_tables=d)

    def inner() -> object:
        return [a], {"b": (b,)}

    def outer() -> object:
        return inner, meta

    found = {id(t) for t in closed_over_tensors(outer)}
    assert found == {id(a), id(b), id(c), id(d)}


def decode_batch(tables: list[list[int]], seq_lens: list[int], block_size: int) -> HostBatch:
    slots = [t[(n - 1) // block_size] * block_size + (n - 1) % block_size for t, n in zip(tables, seq_lens)]
    width = max(map(len, tables))
    return HostBatch(input_ids=[11, 12, 13][:len(tables)], positions=[n - 1 for n in seq_lens], slot_mapping=slots,
                     query_start_loc=list(range(len(tables) + 1)), seq_lens=seq_lens,
                     block_tables=[t + [0] * (width - len(t)) for t in tables],
                     logits_indices=list(range(len(tables))), sampling_req_ids=[])


def test_fill_pads_rows_with_slot_minus_one_and_the_null_block() -> None:
    buffers = StaticBuffers.allocate(8, 6, torch.device("cpu"))
    buffers.block_tables.fill_(9)  # stale rows of an earlier, larger batch
    buffers.seq_lens.fill_(77)
    batch = decode_batch([[3, 5], [7], [2, 4, 6]], [20, 9, 33], block_size=16)
    assert batch.is_decode_only and batch.max_query_len == 1
    buffers.fill(batch, bucket=4)
    assert buffers.input_ids[:4].tolist() == [11, 12, 13, 0]
    assert buffers.positions[:4].tolist() == [19, 8, 32, 0]
    assert buffers.slot_mapping[:4].tolist() == [5 * 16 + 3, 7 * 16 + 8, 6 * 16 + 0, -1]
    assert buffers.seq_lens[:4].tolist() == [20, 9, 33, 1]
    assert buffers.block_tables[:3, :3].tolist() == [[3, 5, 0], [7, 0, 0], [2, 4, 6]]
    assert buffers.block_tables[3, :3].tolist() == [0] * 3  # the padding row reads block 0 only
    assert buffers.block_tables[:, 3:].eq(9).all()  # past the batch's width: stale, never read
    assert buffers.seq_lens[4:].tolist() == [77] * 4  # rows past the bucket are not touched
    assert buffers.slot_mapping[4:].tolist() == [-1] * 4
    md = buffers.metadata(4, max_model_len=96)
    assert (md.max_query_len, md.max_seq_len, md.num_seqs) == (1, 96, 4)
    assert md.query_start_loc.tolist() == [0, 1, 2, 3, 4] and md.block_tables.shape == (4, 6)
    assert md.slot_mapping.data_ptr() == buffers.token_rows[2].data_ptr()  # views: a replay sees each fill


def test_fill_of_a_verify_graph_packs_tokens_then_one_token_per_padding_row() -> None:
    """q = 4: rows of 4, 1 and 2 tokens in a bucket of 4 rows (16 token slots)."""
    buffers = StaticBuffers.allocate(8, 6, torch.device("cpu"), query_len=4)
    batch = HostBatch(input_ids=[1, 2, 3, 4, 5, 6, 7], positions=[8, 9, 10, 11, 3, 20, 21],
                      slot_mapping=[24, 25, 26, 27, 11, 36, 37], query_start_loc=[0, 4, 5, 7], seq_lens=[12, 4, 22],
                      block_tables=[[1, 3], [1, 0], [2, 4]], logits_indices=[3, 4, 6], sampling_req_ids=[])
    buffers.fill(batch, bucket=4)
    assert buffers.input_ids[:16].tolist() == [1, 2, 3, 4, 5, 6, 7] + [0] * 9
    assert buffers.slot_mapping[:16].tolist() == [24, 25, 26, 27, 11, 36, 37] + [-1] * 9
    assert buffers.query_start_loc[:5].tolist() == [0, 4, 5, 7, 8]  # the padding row owns slot 7
    assert buffers.seq_lens[:4].tolist() == [12, 4, 22, 1]
    assert buffers.block_tables[3, :2].tolist() == [0, 0]
    md = buffers.metadata(4, max_model_len=96)
    assert (md.max_query_len, md.num_seqs, md.slot_mapping.numel()) == (4, 4, 16)


def test_fill_of_a_tree_graph_takes_the_mask_or_makes_causal_rows() -> None:
    """q = 4 with TreeMask rows: a batch's own rows are copied; a batch without a tree gets one past each token's
    key; padding tokens see key 0."""
    buffers = StaticBuffers.allocate(4, 6, torch.device("cpu"), query_len=4, tree=True)
    batch = HostBatch(input_ids=[1, 2, 3, 4, 5], positions=[9, 10, 10, 11, 4], slot_mapping=[0] * 5,
                      query_start_loc=[0, 4, 5], seq_lens=[12, 5], block_tables=[[1], [2]], logits_indices=[],
                      sampling_req_ids=[], tree_mask=([9, 10, 10, 10, 5], [0, 1, 2, 5, 0]))
    buffers.fill(batch, bucket=4)
    assert buffers.tree_rows[:, :16].tolist() == [[9, 10, 10, 10, 5] + [1] * 11, [0, 1, 2, 5, 0] + [0] * 11]
    batch.tree_mask = None
    buffers.fill(batch, bucket=4)
    assert buffers.tree_rows[0, :7].tolist() == [9, 10, 11, 12, 5, 1, 1] and not buffers.tree_rows[1].any()
    md = buffers.metadata(4, max_model_len=96)
    assert md.tree_mask.ctx.data_ptr() == buffers.tree_rows[0].data_ptr()
    assert StaticBuffers.allocate(4, 6, torch.device("cpu"), query_len=4).metadata(4, 96).tree_mask is None


def test_fill_takes_numpy_arrays_as_it_takes_lists() -> None:
    """The EAGLE feed hands fill numpy arrays (lamina/spec/eagle_loop.py): the same buffers as from lists."""
    import numpy as np

    fields = dict(input_ids=[1, 2, 3, 4, 5], positions=[8, 9, 10, 3, 20], slot_mapping=[24, 25, 26, 11, 36],
                  query_start_loc=[0, 3, 4, 5], seq_lens=[11, 4, 21], block_tables=[[1, 3], [1, 0], [2, 4]])
    filled = []
    for convert in (list, np.asarray):
        buffers = StaticBuffers.allocate(8, 6, torch.device("cpu"), query_len=4)
        buffers.fill(HostBatch(**{k: convert(v) for k, v in fields.items()}, logits_indices=[2, 3, 4],
                               sampling_req_ids=[]), bucket=4)
        filled.append([t.clone() for t in (buffers.token_rows, buffers.seq_lens, buffers.query_start_loc,
                                           buffers.block_tables)])
    assert all(torch.equal(a, b) for a, b in zip(*filled))
    assert filled[1][2][:5].tolist() == [0, 3, 4, 5, 6]


def test_graph_decision() -> None:
    cpu = torch.device("cpu")
    assert graph_decision(cpu, False, "triton", True) == (False, "eager: device is cpu")
    assert graph_decision(CUDA, True, "triton", True)[0] is False
    assert "enforce_eager" in graph_decision(CUDA, True, "triton", True)[1]
    assert graph_decision(CUDA, False, "torch", False)[0] is False
    assert graph_decision(CUDA, False, "triton", False)[0] is False
    assert graph_decision(CUDA, False, "triton", True)[0] is True
