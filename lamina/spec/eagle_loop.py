"""EAGLE drafting in CUDA graphs: the head as a DraftLoop net (lamina/spec/draft_loop.py), and one propose_fed call
laid out as the loop's rows.

    feed f: head positions [s, s + c) of one request (lamina/spec/eagle.py)    one catch-up row
      input ids    token_ids[s + 1 : s + c + 1]                                the graph's static token slots
      features     the step's rows [row, row + c) -> EagleNet.features          one copy into a static buffer
      last / base  the flat index of position s + c - 1 / s + c - 1             (= N - 2 when f drafts)
      limit        the request's drafts when f ends at N - 2, else 0 (fed only)

A feed longer than q = k + 1 (a prompt chunk) is fed eagerly first: all of it, or all but its last position when
it drafts (that one stays a row). Two loops share the net and its buffer: k drafts, and a feed-only one (the
catch-up alone) for the steps where nobody drafts but the head must still see every position.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from lamina.graphs import TorchCUDAGraph
from lamina.models.common import CausalLM
from lamina.spec.draft_loop import CatchUp, DraftLoop, block_table, slot_mapping
from lamina.spec.eagle_head import EagleHead

__all__ = ["EagleLoops", "EagleNet", "GraphRow"]


class EagleNet:
    """The EAGLE head as a LoopNet: the catch-up fuses `features` (filled before each replay, one row per token
    slot); the steps carry the head's pre-norm output y."""

    def __init__(self, head: EagleHead, target: CausalLM, max_tokens: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.head, self.target = head, target
        width = len(head.cfg.aux_hidden_state_layers) * head.cfg.hidden_size
        self.features = torch.zeros(max_tokens, width, dtype=dtype, device=device)

    def catch_up(self, input_ids: torch.Tensor, positions: torch.Tensor, last: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.head.fc(self.features[:len(input_ids)])
        normed, y = self.head(self.target.model.embed_tokens(input_ids), x, positions)
        return self.target.compute_logits(normed.index_select(0, last)), y.index_select(0, last)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, carry: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
        normed, y = self.head(self.target.model.embed_tokens(tokens), carry, positions)
        return self.target.compute_logits(normed), y


@dataclass(slots=True)
class GraphRow:
    """One catch-up row: head positions [start, start + count) of a request, the step's feature rows
    [row, row + count), and its drafts (0: fed only); index: the request's place in the call (-1: none)."""

    token_ids: list[int] | tuple[int, ...]
    block_ids: list[int]
    start: int
    count: int
    row: int
    limit: int
    index: int


class EagleLoops:
    def __init__(self, head: EagleHead, target: CausalLM, k: int, max_batch_size: int, max_model_len: int,
                 block_size: int, dtype: torch.dtype, device: torch.device, graph_cls: type = TorchCUDAGraph) -> None:
        self.q, self.block_size = k + 1, block_size
        self.net = EagleNet(head, target, max_batch_size * self.q, dtype, device)  # the largest bucket's slots
        args = (max_batch_size, max_model_len, block_size, device, graph_cls, self.q)
        self.drafting, self.feeding = DraftLoop(self.net, k, *args), DraftLoop(self.net, 1, *args)

    def capture_all(self) -> None:
        self.drafting.capture_all()
        self.feeding.capture_all()

    def fits(self, num_rows: int, width: int) -> bool:
        return self.drafting.fits(num_rows, width, self.drafting.k)

    def run(self, rows: list[GraphRow], features: torch.Tensor) -> list[list[int]]:
        """Each row's drafts (its first `limit` tokens) after one replay; `features`: the step's [T, 3H]."""
        loop = self.drafting if any(r.limit for r in rows) else self.feeding
        starts, positions, feature_rows, row_of = _flat_rows(rows)
        table = block_table([r.block_ids for r in rows])
        last = starts[1:] - 1  # each row's last token; its position is the row's base
        ids = itertools.chain.from_iterable(r.token_ids[r.start + 1:r.start + 1 + r.count] for r in rows)
        batch = CatchUp(input_ids=np.fromiter(ids, dtype=np.int64, count=len(positions)), positions=positions,
                        slot_mapping=slot_mapping(table, row_of, positions, self.block_size),
                        query_start_loc=starts, seq_lens=positions[last] + 1, block_tables=table)
        index = torch.from_numpy(feature_rows).to(features.device, non_blocking=True)
        self.net.features[:len(feature_rows)].copy_(features.index_select(0, index))
        out = loop.run(batch, last, positions[last], [r.limit for r in rows])
        if loop is self.feeding:  # nothing to read: no host sync, so a step launched ahead stays ahead
            return [[] for _ in rows]
        return [tokens[:r.limit] for r, tokens in zip(rows, out.tolist())]  # the one host read


def _flat_rows(rows: list[GraphRow]) -> tuple[np.ndarray, ...]:
    """(query starts [n + 1], head positions [T], feature rows [T], row of each token [T]) of the rows' tokens."""
    counts = np.fromiter((r.count for r in rows), dtype=np.int64, count=len(rows))
    starts = np.concatenate(([0], np.cumsum(counts)))
    row_of = np.repeat(np.arange(len(rows)), counts)
    offset = np.arange(starts[-1]) - starts[row_of]  # each token's place in its row
    first = np.array([(r.start, r.row) for r in rows], dtype=np.int64)
    return starts, first[row_of, 0] + offset, first[row_of, 1] + offset, row_of
