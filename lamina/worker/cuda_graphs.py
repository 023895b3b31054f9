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
tenth of a batch-1 step of the demo model; steps that sample otherwise leave it unread (a few us of device time).
Larger buckets, and tensor-parallel models, compute the sampling rows' logits after the replay. Sampling runs
outside the graph.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import torch

from lamina.attention.metadata import set_attention_metadata
from lamina.graphs import Graph, StaticBuffers, TorchCUDAGraph, bucket_for, capture, graph_buckets, graph_pool
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
                 tree: bool = False, prefill_tokens: int = 0) -> None:
        """`query_lens`: decode (1) and verify (1 + k) graphs, every bucket; `tree`: the verify graphs (q > 1) take
        tree drafts' masks (lamina/graphs.py); `prefill_tokens`: the token slots of the largest prefill graph (the
        module docstring; 0: prompt chunks run eagerly)."""
        self.model = model
        self.logits_in_graph = getattr(getattr(model, "lm_head", None), "tp_size", 1) == 1  # no collective in it
        self.logits: torch.Tensor | None = None  # [LOGITS_IN_GRAPH_TOKENS, vocab], shared by the small buckets
        self.argmax: torch.Tensor | None = None  # [LOGITS_IN_GRAPH_TOKENS] int64: each slot's greedy token
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
            return hidden
        return forward

    def _logits_buffers(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(self.logits, self.argmax), allocated by the first run of a small bucket's function (its eager run before
        the capture, lamina.graphs.capture: outside any graph's memory pool)."""
        if self.logits is None:
            self.logits = torch.empty((LOGITS_IN_GRAPH_TOKENS, logits.shape[-1]), dtype=logits.dtype,
                                      device=logits.device)
            self.argmax = torch.zeros(LOGITS_IN_GRAPH_TOKENS, dtype=torch.int64, device=logits.device)
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
            drafts: DevicePatch | None = None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Replay `graph` (graph_for(batch)) over the batch: (hidden states [T, hidden] of its T tokens, their logits
        [T, vocab] and argmax [T], or None and None when the bucket's graph does not compute them), views of the
        graph's outputs, to use before the next replay. `input_ids` [T], on the device, replace the batch's;
        `drafts` replace some of them."""
        graph_set, bucket = graph
        graph_set.buffers.fill(batch, bucket)
        num_tokens = len(batch.input_ids)
        if input_ids is not None:
            graph_set.buffers.input_ids[:num_tokens].copy_(input_ids)
        if drafts is not None:
            drafts.apply(graph_set.buffers.input_ids)
        graph_set.graphs[bucket].replay()
        hidden = graph_set.outputs[bucket][:num_tokens]
        if not self.with_logits(bucket * graph_set.buffers.query_len):
            return hidden, None, None
        return hidden, self.logits[:num_tokens], self.argmax[:num_tokens]
