"""CUDA graphs for decode, verify and small prefill steps: one graph per (query length, batch-size bucket),
replayed on static buffers (their layout: lamina/graphs.py).

A batch of n rows whose longest row has q_max tokens runs in the graph of the smallest captured query length
q >= q_max whose buckets hold n rows, in the smallest such bucket b >= n:

    q = 1                  decode            buckets 1, 2, 4, 8, 16, .. max batch (lamina.graphs.graph_buckets)
    q = 1 + k              verify (drafting) the same buckets
    q = 16, 32, .. P       prompt chunks     buckets 1, 2, 4 with b * q <= P (prefill_tokens; 0: none)

An eager prefill of a short prompt launches every kernel of the model from the host (some 130 launches, ~5 ms on an
H100's host for the demo model: most of a batch-1 request's time to first token); replayed, it costs one launch.
A chunk padded up to q computes up to twice its tokens, which costs little while a forward is bound by reading the
weights: on an H100 / H200 a bf16 matmul of up to ~200-300 rows is (2 FLOP per 2-byte weight and row, against
989 TFLOP/s over 3.35-4.8 TB/s), hence the default of 256 slots (EngineConfig.cuda_graph_prefill_tokens). Longer
chunks and larger batches stay eager: their kernels' work outweighs their launches.

Buckets of at most LOGITS_IN_GRAPH_TOKENS token slots (b x q) compute the logits of every slot inside the
graph too, into one buffer that every such graph shares (a step reads its logits before the next replay; the LM
head launched from the host cost a decode step of a small model about as much host time as the rest of its
launch), and each slot's argmax, into a second one: greedy sampling's tokens, which the two kernels of the
argmax launched from the host cost ~55 us of an H100 host's time a step (torch.argmax's one launch ~10 us), a
tenth of a batch-1 step of the demo model. With the sampling kernel (CUDA and triton: the model runner's
`kernel_sampling`) these graphs also sample every slot, into a third buffer, from a fourth that the step fills
before the replay (`SlotSampling`, one host-to-device copy): each slot's Philox key, temperature, top-p and min-p;
slots of temperature 0 copy their argmax. A step whose rows need nothing else (no top-k, penalties or min_tokens)
takes its tokens from there, a verify step its drafting rows' too (keyed as the model runner keys them): no
sampling metadata and no kernel launched from the host, which cost a sampled batch-1 step ~0.13 ms of an H100
host's time beside a greedy one's (0.34 against 0.21 ms). Other steps leave it unread (a few us of device time).
Larger buckets, and tensor-parallel models, compute the sampling rows' logits after the replay and sample outside
the graph.

    sampling rows [4, LOGITS_IN_GRAPH_TOKENS] int64, column = token slot:
      0  Philox key                          (the row's, lamina.layers.sampling_metadata.philox_keys)
      1  temperature  | float64 bit patterns (0: greedy, and every slot that samples nothing)
      2  top_p        |                      (1: off)
      3  min_p        |                      (0: off)
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable

import numpy as np
import torch

from lamina.attention.metadata import set_attention_metadata
from lamina.graphs import Graph, StaticBuffers, TorchCUDAGraph, bucket_for, capture, graph_buckets, graph_pool
from lamina.layers.dispatch import kernel_module
from lamina.layers.sampler import greedy_tokens
from lamina.worker.input_batch import DevicePatch, HostBatch

logger = logging.getLogger(__name__)

LOGITS_IN_GRAPH_TOKENS = 64  # token slots whose logits a graph computes: the shared buffer's rows (vocab floats each)
PREFILL_BUCKETS = (1, 2, 4)  # rows of the prefill graphs
PREFILL_MIN_QUERY_LEN = 16  # the shortest prefill graph's q (verify graphs take rows of up to 8 tokens)


def prefill_query_lens(prefill_tokens: int) -> list[int]:
    """The prefill graphs' query lengths: 16, 32, .. while one row of q tokens fits in `prefill_tokens`."""
    lens, q = [], PREFILL_MIN_QUERY_LEN
    while q <= prefill_tokens:
        lens, q = lens + [q], 2 * q
    return lens


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
    return True, "CUDA graphs for decode (and verify) batches"


@dataclass
class SlotSampling:
    """What a replay samples: token slot slots[i] draws with Philox key keys[i] under temperature[i], top_p[i] and
    min_p[i] (temperature 0: its argmax); every other slot is greedy."""

    slots: list[int]
    keys: list[int]
    temperature: list[float]
    top_p: list[float]
    min_p: list[float]

    def rows(self, num_slots: int) -> np.ndarray:
        """The sampling rows' host array (the module docstring's layout) for the first `num_slots` slots."""
        rows = np.zeros((4, num_slots), dtype=np.int64)
        rows[0, self.slots] = self.keys
        floats = rows[1:].view(np.float64)  # the kernel rounds each to float32, as torch.tensor(..., float32) does
        floats[0, self.slots], floats[1, self.slots] = self.temperature, self.top_p
        floats[2, self.slots] = self.min_p
        return rows


@dataclass
class GraphSet:
    """The graphs of one query length q: one per bucket, over one set of static buffers."""

    buffers: StaticBuffers
    buckets: list[int]
    graphs: dict[int, Graph] = field(default_factory=dict)
    outputs: dict[int, torch.Tensor] = field(default_factory=dict)


class CudaGraphRunner:
    """Captures the model's forward per (query length, bucket) and replays it for batches that fit."""

    def __init__(self, model: torch.nn.Module, max_batch_size: int, max_model_len: int, block_size: int,
                 device: torch.device, graph_cls: type = TorchCUDAGraph, query_lens: tuple[int, ...] = (1,),
                 tree: bool = False, prefill_tokens: int = 0, sample: bool = False) -> None:
        """`query_lens`: decode (1) and verify (1 + k) graphs, every bucket; `tree`: the verify graphs (q > 1) take
        tree drafts' masks (lamina/graphs.py); `prefill_tokens`: the token slots of the largest prefill graph (the
        module docstring; 0: prompt chunks run eagerly); `sample`: the graphs that compute logits sample too (the
        sampling kernel, lamina/kernels/sampling.py)."""
        self.model = model
        self.logits_in_graph = getattr(getattr(model, "lm_head", None), "tp_size", 1) == 1  # no collective in it
        self.sampling_kernels: ModuleType | None = kernel_module("sampling") if sample else None
        self.logits: torch.Tensor | None = None  # [LOGITS_IN_GRAPH_TOKENS, vocab], shared by the small buckets
        self.argmax: torch.Tensor | None = None  # [LOGITS_IN_GRAPH_TOKENS] int64: each slot's greedy token
        self.sampled: torch.Tensor | None = None  # [LOGITS_IN_GRAPH_TOKENS] int64: each slot's sampled token
        self.sampling_rows: torch.Tensor | None = None  # [4, LOGITS_IN_GRAPH_TOKENS] int64 (module docstring)
        self._sampling_rows_set = False  # whether a slot may have a temperature above 0
        self.buckets = graph_buckets(max_batch_size)
        self.max_model_len = max_model_len
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.device = device
        self.graph_cls = graph_cls
        shapes = {q: (self.buckets, tree and q > 1) for q in query_lens}  # q -> (buckets, tree masks)
        shapes |= {q: ([b for b in PREFILL_BUCKETS if b * q <= prefill_tokens and b <= max_batch_size], False)
                   for q in prefill_query_lens(min(prefill_tokens, max_model_len))}  # q >= 16 > any verify q
        self.sets = {q: GraphSet(StaticBuffers.allocate(buckets[-1], self.max_blocks_per_seq, device, q, tree_),
                                 list(buckets))
                     for q, (buckets, tree_) in sorted(shapes.items())}

    @torch.inference_mode()
    def capture_all(self) -> None:
        """Longest rows and largest bucket first, all in one memory pool (smaller graphs reuse the largest
        one's memory)."""
        pool = graph_pool(self.graph_cls)
        for graph_set in reversed(self.sets.values()):
            for bucket in reversed(graph_set.buckets):
                graph, output = capture(self._forward_fn(graph_set, bucket), self.graph_cls, pool, self.device)
                graph_set.graphs[bucket], graph_set.outputs[bucket] = graph, output
        logger.info("captured %d CUDA graphs (query lengths %s) for batches of up to %d sequences",
                    sum(len(s.buckets) for s in self.sets.values()), list(self.sets), self.buckets[-1])

    def with_logits(self, num_slots: int) -> bool:
        """Whether the graph of a bucket of `num_slots` token slots computes their logits (into self.logits)."""
        return self.logits_in_graph and num_slots <= LOGITS_IN_GRAPH_TOKENS

    def samples(self, graph: tuple[GraphSet, int]) -> bool:
        """Whether `graph` (graph_for's) samples its slots (run's `sampling`)."""
        graph_set, bucket = graph
        return self.sampling_kernels is not None and self.with_logits(bucket * graph_set.buffers.query_len)

    def _forward_fn(self, graph_set: GraphSet, bucket: int) -> Callable[[], torch.Tensor]:
        """The captured function of `bucket`: the hidden states of its token slots; their logits and argmax copied
        into the first rows of self.logits and self.argmax when the bucket is small enough."""
        buffers = graph_set.buffers
        metadata = buffers.metadata(bucket, self.max_model_len)
        num_tokens = bucket * buffers.query_len
        ids, pos = buffers.input_ids[:num_tokens], buffers.positions[:num_tokens]
        with_logits = self.with_logits(num_tokens)

        def forward() -> torch.Tensor:
            with set_attention_metadata(metadata):
                hidden = self.model(ids, pos)
            if with_logits:
                logits = self.model.compute_logits(hidden)
                logits_out, argmax_out = self._logits_buffers(logits)
                logits_out[:num_tokens].copy_(logits)
                argmax_out[:num_tokens].copy_(greedy_tokens(logits))
                if self.sampling_kernels is not None:
                    self._sample_slots(logits, num_tokens)
            return hidden
        return forward

    def _sample_slots(self, logits: torch.Tensor, num_slots: int) -> None:
        """self.sampled[:num_slots]: each slot's token under self.sampling_rows (its argmax at temperature 0)."""
        keys, floats = self.sampling_rows[0, :num_slots], self.sampling_rows[1:, :num_slots].view(torch.float64)
        self.sampling_kernels.sample(logits, floats[0], keys, top_p=floats[1], min_p=floats[2],
                                     argmax=self.argmax[:num_slots], out=self.sampled[:num_slots])

    def _logits_buffers(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(self.logits, self.argmax), allocated by the first run of a small bucket's function (its eager run before
        the capture, lamina.graphs.capture: outside any graph's memory pool), with the sampling buffers."""
        if self.logits is None:
            slots, device = LOGITS_IN_GRAPH_TOKENS, logits.device
            self.logits = torch.empty((slots, logits.shape[-1]), dtype=logits.dtype, device=device)
            self.argmax = torch.zeros(slots, dtype=torch.int64, device=device)
            self.sampled = torch.zeros(slots, dtype=torch.int64, device=device)
            self.sampling_rows = torch.zeros((4, slots), dtype=torch.int64, device=device)
        return self.logits, self.argmax

    def graph_for(self, batch: HostBatch) -> tuple[GraphSet, int] | None:
        """(set, bucket): the captured set of the shortest query length that holds the batch's longest row in
        one of its buckets, and the smallest such bucket; None: the batch runs eagerly."""
        if batch.num_seqs > self.buckets[-1] or len(batch.block_tables[0]) > self.max_blocks_per_seq:
            return None
        longest = 1 if batch.is_decode_only else batch.max_query_len  # the common case without a row walk
        tree = batch.tree_mask is not None
        for q, graph_set in self.sets.items():
            if q < longest or not graph_set.graphs or (tree and graph_set.buffers.tree_rows is None):
                continue
            bucket = bucket_for(batch.num_seqs, graph_set.buckets)
            if bucket is not None:
                return graph_set, bucket
        return None

    def run(self, batch: HostBatch, graph: tuple[GraphSet, int], input_ids: torch.Tensor | None = None,
            drafts: DevicePatch | None = None, sampling: SlotSampling | None = None) -> GraphOutputs:
        """Replay `graph` (graph_for(batch)) over the batch; its outputs are views of the graph's buffers, to use
        before the next replay. `input_ids` [T], on the device, replace the batch's; `drafts` replace some of them;
        `sampling`: what its slots sample (only where `samples(graph)`; None: every slot is greedy)."""
        graph_set, bucket = graph
        graph_set.buffers.fill(batch, bucket)
        num_tokens = len(batch.input_ids)
        if input_ids is not None:
            graph_set.buffers.input_ids[:num_tokens].copy_(input_ids)
        if drafts is not None:
            drafts.apply(graph_set.buffers.input_ids)
        num_slots = bucket * graph_set.buffers.query_len
        if sampling is not None or self._sampling_rows_set:
            self._fill_sampling(sampling, num_slots)
        graph_set.graphs[bucket].replay()
        hidden = graph_set.outputs[bucket][:num_tokens]
        if not self.with_logits(num_slots):
            return GraphOutputs(hidden)
        sampled = None if sampling is None else self.sampled[:num_tokens]
        return GraphOutputs(hidden, self.logits[:num_tokens], self.argmax[:num_tokens], sampled)

    def _fill_sampling(self, sampling: SlotSampling | None, num_slots: int) -> None:
        """The sampling rows of the next replay: `sampling`'s (one non-blocking copy), or temperature 0 everywhere
        after a replay that sampled (the sampling kernel then copies argmaxes: no pass over the vocabulary)."""
        if sampling is None:
            self.sampling_rows[1].zero_()
        else:
            self.sampling_rows[:, :num_slots].copy_(torch.from_numpy(sampling.rows(num_slots)), non_blocking=True)
        self._sampling_rows_set = sampling is not None


@dataclass
class GraphOutputs:
    """A replay's outputs over the batch's T tokens: hidden states [T, hidden]; where the graph computes them (its
    bucket is small: CudaGraphRunner.with_logits) logits [T, vocab] and argmax [T]; `sampled` [T] when the replay
    was given what to sample."""

    hidden: torch.Tensor
    logits: torch.Tensor | None = None
    argmax: torch.Tensor | None = None
    sampled: torch.Tensor | None = None
