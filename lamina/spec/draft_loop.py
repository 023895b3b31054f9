"""DraftLoop: a proposer's whole drafting call in one CUDA graph per batch bucket: a catch-up forward, then k - 1
one-token steps whose inputs are made on the device, without returning to the host in between. What runs is a
`LoopNet`: a draft model (`ModelNet`), the target stopped after its first layers (`ModelNet(model, num_layers)`:
early exit) or an EAGLE head (lamina/spec/eagle_loop.py).

    catch-up     rows of at most q tokens (query_len, k + 1 by default; lamina/graphs.py's layout): what the
                 net has not yet fed of each row, through the position before its first draft
                 draft 0 = pick(net.catch_up logits at each row's last token)     last[i]: its flat index
    step j       feed draft j-1 (on the device) at (1 <= j < k):
                   pos   = base + j            if j < limit  else base
                   slot  = table[pos // bs] * bs + pos % bs  if j < limit  else -1  (writes nothing)
                   seq   = pos + 1
                 (every step's pos, slot and seq are computed on the host with the catch-up and copied with
                 it: `step_rows`; no arithmetic kernels in the loop)
                 draft j = pick(net.step logits)
    output       drafts [b, k]; row i's first limit[i] are its drafts

pick: the argmax, or for a row with DraftKeys a sample drawn with the noise of the row that verifies it
(lamina/spec/draft_sampling.py: the sampling kernel inside the graph, its keys and parameters copied with the
rows; without the kernel on CUDA, or in a loop that does not sample, the argmax).

base is the position of the catch-up's last token: N - 1 for a draft model and early exit (it feeds the newest
token), N - 2 for EAGLE (head position p holds token p + 1). A row past its limit (or a padding row: base 0,
limit 0, the null block) recomputes a position it already has and stores nothing, so every row writes KV only
inside [0, base + limit]. On CPU `EagerGraph` runs the same function (the tests), so the device-side inputs are
checked against the eager path without a GPU.
"""
from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from lamina.attention.metadata import AttentionMetadata, set_attention_metadata
from lamina.device import to_host_async
from lamina.graphs import FlatBatch, Graph, StaticBuffers, TorchCUDAGraph, bucket_for, capture_buckets, graph_buckets
from lamina.spec.draft_sampling import DraftKeys, pick, sampling_kernels

logger = logging.getLogger(__name__)


@dataclass
class CatchUp:
    """The catch-up forward of one call as a flat batch (lamina.graphs.FlatBatch): lists or numpy arrays."""

    input_ids: Sequence[int] | np.ndarray
    positions: Sequence[int] | np.ndarray
    slot_mapping: Sequence[int] | np.ndarray
    query_start_loc: Sequence[int] | np.ndarray
    seq_lens: Sequence[int] | np.ndarray
    block_tables: Sequence[Sequence[int]] | np.ndarray

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)


def block_table(tables: Sequence[Sequence[int]]) -> np.ndarray:
    """[B, W] int32: each row's block ids, padded with 0 (the null block) to the widest."""
    lengths = np.fromiter(map(len, tables), dtype=np.int64, count=len(tables))
    out = np.zeros((len(tables), int(lengths.max())), dtype=np.int32)
    filled = np.arange(out.shape[1]) < lengths[:, None]  # row-major: the ids in the order they are listed
    out[filled] = np.fromiter(itertools.chain.from_iterable(tables), dtype=np.int32, count=int(lengths.sum()))
    return out


def slot_mapping(table: np.ndarray, row_of: np.ndarray, positions: np.ndarray, block_size: int) -> np.ndarray:
    """[T] int64: the KV slot of each token, positions[t] of row row_of[t] of `table` (block_table's layout)."""
    return table[row_of, positions // block_size].astype(np.int64) * block_size + positions % block_size


def stack_columns(columns: list[torch.Tensor]) -> torch.Tensor:
    """Eager drafting's drafts as one [n, len(columns)] tensor, on the device: column j holds draft j of the first
    len(columns[j]) rows (a row's entries past its own drafts are 0)."""
    out = columns[0].new_zeros((len(columns[0]), len(columns)))
    for j, column in enumerate(columns):
        out[:len(column), j] = column
    return out


def step_rows(table: np.ndarray, base: np.ndarray, limit: np.ndarray, k: int, block_size: int) -> np.ndarray:
    """[k - 1, 3, b] int64: pos, slot and seq of each of b rows at each step j = 1 .. k - 1 (the module
    docstring: a row past its limit recomputes its base and stores nothing); `table` [b, W] holds the block ids."""
    j = np.arange(1, k)[:, None]
    active = limit[None, :] > j
    pos = np.where(active, base[None, :] + j, base[None, :])
    block = table[np.arange(len(base))[None, :], pos // block_size].astype(np.int64)
    slot = np.where(active, block * block_size + pos % block_size, -1)
    return np.stack([pos, slot, pos + 1], axis=1)


class HostCopy:
    """A device tensor's copy into pinned host memory, queued now and read later (`tolist` waits for it: by
    then the step after it has usually been waited for, and the copy is there). A CPU tensor is kept as it is."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self._done = None
        self._list: list | None = None
        self._host = to_host_async(tensor)
        if tensor.device.type != "cpu":
            self._done = torch.cuda.Event()
            self._done.record()

    def tolist(self) -> list:
        if self._list is None:
            if self._done is not None:
                self._done.synchronize()
            self._list = self._host.tolist()
        return self._list


class LoopNet(Protocol):
    """What a DraftLoop runs (inside a graph: device tensors in, device tensors out, no host reads)."""

    def catch_up(self, input_ids: torch.Tensor, positions: torch.Tensor, last: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A flat batch (attention metadata set): (logits at the rows `last` [b, V], a carry for step 1)."""

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, carry: torch.Tensor | None
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One token a row (metadata set): (logits [b, V], the carry of the next step)."""


class ModelNet:
    """A causal LM as a LoopNet: a draft model, or (num_layers) the target's first layers, its final norm and LM
    head (early exit). Nothing is carried between steps: the KV cache holds what the steps fed."""

    def __init__(self, model: torch.nn.Module, num_layers: int | None = None) -> None:
        self.model, self.num_layers = model, num_layers

    def catch_up(self, input_ids: torch.Tensor, positions: torch.Tensor, last: torch.Tensor
                 ) -> tuple[torch.Tensor, None]:
        return self.model.compute_logits(self._forward(input_ids, positions).index_select(0, last)), None

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, carry: None) -> tuple[torch.Tensor, None]:
        return self.model.compute_logits(self._forward(tokens, positions)), None

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.num_layers is None:
            return self.model(input_ids, positions)
        return self.model.forward_layers(input_ids, positions, self.num_layers)


class DraftLoop:
    def __init__(self, net: LoopNet, k: int, max_batch_size: int, max_model_len: int, block_size: int,
                 device: torch.device, graph_cls: type = TorchCUDAGraph, query_len: int | None = None,
                 samples: bool = True, buckets: Sequence[int] | None = None) -> None:
        """k drafts a row from catch-ups of up to `query_len` tokens a row (default k + 1); `samples`: whether
        rows with DraftKeys sample their drafts (False: every draft is the argmax, as EAGLE's); `buckets`: the
        batch sizes captured (default graph_buckets(max_batch_size))."""
        self.net = net
        self.k = k
        self.query_len = k + 1 if query_len is None else query_len
        self.buckets = graph_buckets(max_batch_size) if buckets is None else list(buckets)
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.device = device
        self.graph_cls = graph_cls
        rows = self.buckets[-1]
        self.buffers = StaticBuffers.allocate(rows, self.max_blocks_per_seq, device, query_len=self.query_len)
        # the catch-up's last index, then pos, slot and seq of each step j (step_rows), then each draft's keys
        self.rows = torch.zeros(1 + 3 * (k - 1) + k, rows, dtype=torch.int64, device=device)
        # the rows' temperature, top-p and min-p (DraftKeys.params), copied only when they change
        self._params_host = DraftKeys.argmax_params(rows)  # what self.params holds
        self.params = torch.from_numpy(self._params_host.copy()).to(device)
        self.kernels = sampling_kernels(device) if samples else None
        # without the kernel on CUDA, the argmax: a graph cannot capture the torch path's generators
        self.sampled = samples and (self.kernels is not None or device.type != "cuda")
        self.decode_starts = torch.arange(rows + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, Graph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def fits(self, num_rows: int, width: int, most_drafts: int) -> bool:
        """Whether a call of `num_rows` rows with block tables `width` wide, none asking more than `most_drafts`,
        replays a graph (catch-ups longer than query_len tokens are fed eagerly first)."""
        return num_rows <= self.buckets[-1] and width <= self.max_blocks_per_seq and most_drafts <= self.k

    @torch.inference_mode()
    def capture_all(self) -> None:
        self.graphs, self.outputs = capture_buckets(self._loop_fn, self.buckets, self.graph_cls, self.device)
        logger.info("draft loop: %d CUDA graphs (k=%d, catch-ups of up to %d tokens a row) for up to %d sequences",
                    len(self.buckets), self.k, self.query_len, self.buckets[-1])

    def run(self, batch: FlatBatch, last: Sequence[int], base: Sequence[int], limit: Sequence[int],
            keys: DraftKeys | None = None) -> torch.Tensor:
        """Drafts [n, k] on the device (a copy of the graph's output, which the next replay overwrites) of the
        catch-up `batch`; per row: the flat index of its last token, base (the module docstring) and its number
        of drafts; `keys`: how the rows draw their drafts (None: the argmax)."""
        n = batch.num_seqs
        bucket = bucket_for(n, self.buckets)
        self.buffers.fill(batch, bucket)
        rows = np.zeros((1 + 3 * (self.k - 1) + self.k, bucket), dtype=np.int64)
        rows[0, :n], rows[0, n:] = last, len(batch.input_ids) + np.arange(bucket - n)  # padding: its one slot
        steps = rows[1:1 + 3 * (self.k - 1)].reshape(self.k - 1, 3, bucket)  # a view
        steps[:, :, :n] = step_rows(np.asarray(batch.block_tables), np.asarray(base), np.asarray(limit), self.k,
                                    self.block_size)
        steps[:, 0, n:], steps[:, 1, n:], steps[:, 2, n:] = 0, -1, 1  # padding rows: position 0, no slot
        if keys is not None and self.sampled:
            rows[1 + 3 * (self.k - 1):, :n] = keys.keys
        self.rows[:, :bucket].copy_(torch.from_numpy(rows), non_blocking=True)
        self._copy_params(keys, n, bucket)
        self.graphs[bucket].replay()
        return self.outputs[bucket][:n].clone()

    def _copy_params(self, keys: DraftKeys | None, n: int, bucket: int) -> None:
        """The rows' temperature, top-p and min-p into the graphs' buffer, unless it holds them already."""
        params = DraftKeys.argmax_params(bucket)
        if keys is not None and self.sampled:
            params[:, :n] = keys.params
        if np.array_equal(self._params_host[:, :bucket], params):
            return
        self._params_host[:, :bucket] = params
        self.params[:, :bucket].copy_(torch.from_numpy(params), non_blocking=True)

    def _loop_fn(self, bucket: int) -> Callable[[], torch.Tensor]:
        buffers, q = self.buffers, self.query_len
        catch_up = buffers.metadata(bucket, self.max_model_len)
        ids, positions = buffers.input_ids[:bucket * q], buffers.positions[:bucket * q]
        last = self.rows[0, :bucket]
        steps = self.rows[1:1 + 3 * (self.k - 1), :bucket].view(self.k - 1, 3, bucket)
        keys, params = self.rows[1 + 3 * (self.k - 1):, :bucket], list(self.params[:, :bucket])
        table = buffers.block_tables[:bucket]

        def draw(logits: torch.Tensor, j: int) -> torch.Tensor:
            return pick(logits, params, keys[j], self.kernels) if self.sampled else logits.argmax(dim=-1)

        def loop() -> torch.Tensor:
            with set_attention_metadata(catch_up):
                logits, carry = self.net.catch_up(ids, positions, last)
            token = draw(logits, 0)
            drafts = [token]
            seq_lens = steps[:, 2].to(torch.int32) if self.k > 1 else None  # one conversion for every step
            for j in range(1, self.k):
                pos = steps[j - 1, 0]
                with set_attention_metadata(self._step_metadata(table, steps[j - 1, 1], seq_lens[j - 1], bucket)):
                    logits, carry = self.net.step(token, pos, carry)
                token = draw(logits, j)
                drafts.append(token)
            return torch.stack(drafts, dim=1)
        return loop

    def _step_metadata(self, table: torch.Tensor, slots: torch.Tensor, seq_lens: torch.Tensor,
                       bucket: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=slots, query_start_loc=self.decode_starts[:bucket + 1], seq_lens=seq_lens,
            block_tables=table, max_query_len=1, max_seq_len=self.max_model_len,
            query_start_loc_cpu=list(range(bucket + 1)), seq_lens_cpu=[self.max_model_len] * bucket)


WIDE_TOKENS = 1024  # a wide loop's catch-up: its rows x its tokens a row (DraftLoops)


class DraftLoops:
    """A proposer's captured chains: `narrow`, catch-ups of up to k + 1 tokens a row (every call right after a
    verify step) at every batch bucket; and wide loops, one per power-of-two bucket b, for catch-ups of up to
    WIDE_TOKENS // b tokens a row (capped at max_model_len): a new prompt, or a request back from the gate's plain
    windows or the policy's pause, whose catch-up is then one replay rather than an eager forward (on a GPU an
    eager forward is milliseconds of host time: the first step of every SPEC window would pay it).

        rows        1     2     4     8    16    32    64   128      (k = 3, max_batch_size >= 128: only q > k + 1,
        q a row  1024   512   256   128    64    32    16     8       one loop per distinct q; each replay computes
                                                                      WIDE_TOKENS token slots)
    """

    def __init__(self, net: LoopNet, k: int, max_batch_size: int, max_model_len: int, block_size: int,
                 device: torch.device, graph_cls: type = TorchCUDAGraph, samples: bool = True,
                 wide_tokens: int = WIDE_TOKENS) -> None:
        def loop(rows: int, query_len: int, buckets: Sequence[int] | None = None) -> DraftLoop:
            return DraftLoop(net, k, rows, max_model_len, block_size, device, graph_cls, query_len, samples, buckets)
        self.narrow = loop(max_batch_size, k + 1)
        self.wide = [loop(rows, q, [rows]) for rows, q in wide_shapes(k, max_batch_size, max_model_len, wide_tokens)]

    @property
    def k(self) -> int:
        return self.narrow.k

    def capture_all(self) -> None:
        for loop in (self.narrow, *self.wide):
            loop.capture_all()

    def pick(self, num_rows: int, width: int, most_drafts: int, longest: int) -> DraftLoop | None:
        """The loop that replays a call (`longest`: its longest catch-up): the narrow one when every catch-up fits
        it, else the wide loop of the fewest rows that holds the call; None when no loop holds it (the caller
        drafts eagerly). Rows longer than the picked loop's query_len are fed eagerly first."""
        if not self.narrow.fits(num_rows, width, most_drafts):
            return None
        if longest > self.narrow.query_len:
            return next((w for w in self.wide if w.fits(num_rows, width, most_drafts)), self.narrow)
        return self.narrow


def wide_shapes(k: int, max_batch_size: int, max_model_len: int, wide_tokens: int = WIDE_TOKENS
                ) -> list[tuple[int, int]]:
    """(rows, tokens a row) of each wide loop, fewest rows first (DraftLoops): powers of two and max_batch_size."""
    shapes: list[tuple[int, int]] = []
    for rows in [2 ** i for i in range(max_batch_size.bit_length()) if 2 ** i < max_batch_size] + [max_batch_size]:
        q = min(wide_tokens // rows, max_model_len)
        if q > k + 1:
            if shapes and shapes[-1][1] == q:  # the same catch-ups for more rows
                shapes.pop()
            shapes.append((rows, q))
    return shapes
