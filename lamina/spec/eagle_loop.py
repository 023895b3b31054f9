"""EAGLE drafting in CUDA graphs: the head as a DraftLoop net (lamina/spec/draft_loop.py), and one propose call
laid out as the loop's rows.

    row r: head positions [s, s + c) of one request (lamina/spec/eagle.py)     one catch-up row
      input ids    token_ids[s + 1 : s + c + 1]                                the graph's static token slots
      features     the stored fc(f[p]) at each token's KV slot                 read inside the graph by slot
      last / base  the flat index of position s + c - 1 / s + c - 1 (= N - 2)
      limit        the request's drafts

A call whose catch-ups fit k + 1 tokens a row replays the narrow loop; a longer one a wide loop (DraftLoops); a
catch-up longer than the picked loop's query_len is fed eagerly first, all but its base (lamina/spec/eagle.py).
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from lamina.attention.metadata import get_attention_metadata
from lamina.graphs import TorchCUDAGraph
from lamina.models.common import CausalLM
from lamina.spec.draft_loop import CatchUp, DraftLoop, DraftLoops, block_table, slot_mapping
from lamina.spec.eagle_head import EagleHead

__all__ = ["CatchUpRow", "EagleLoops", "EagleNet", "catch_up_batch"]


class EagleNet:
    """The EAGLE head as a LoopNet: the catch-up reads each token's stored features at its KV slot (the catch-up's
    slot mapping; a padding token's -1 reads slot 0, unused); the steps carry the head's pre-norm output y."""

    def __init__(self, head: EagleHead, target: CausalLM, features: torch.Tensor) -> None:
        self.head, self.target, self.features = head, target, features

    def catch_up(self, input_ids: torch.Tensor, positions: torch.Tensor, last: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.features.index_select(0, get_attention_metadata().slot_mapping.clamp(min=0))
        normed, y = self.head(self.target.model.embed_tokens(input_ids), x, positions)
        return self.target.compute_logits(normed.index_select(0, last)), y.index_select(0, last)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, carry: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
        normed, y = self.head(self.target.model.embed_tokens(tokens), carry, positions)
        return self.target.compute_logits(normed), y


@dataclass(frozen=True, slots=True)
class CatchUpRow:
    """One drafting request of a propose call: head positions [start, start + count) to feed, then `limit`
    drafts from its base; index: the request's place in the call."""

    req_id: str
    token_ids: Sequence[int]
    block_ids: list[int]
    start: int
    count: int
    limit: int
    index: int

    @property
    def base(self) -> int:
        """The catch-up's last position, N - 2: its logits give draft 0."""
        return self.start + self.count - 1


class EagleLoops:
    def __init__(self, head: EagleHead, target: CausalLM, features: torch.Tensor, k: int, max_batch_size: int,
                 max_model_len: int, block_size: int, device: torch.device, graph_cls: type = TorchCUDAGraph) -> None:
        self.block_size = block_size
        self.net = EagleNet(head, target, features)
        self.drafting = DraftLoops(self.net, k, max_batch_size, max_model_len, block_size, device, graph_cls,
                                   samples=False)  # argmax drafts (lamina/spec/eagle.py says why)

    def capture_all(self) -> None:
        self.drafting.capture_all()

    def pick(self, num_rows: int, width: int, longest: int) -> DraftLoop | None:
        return self.drafting.pick(num_rows, width, self.drafting.k, longest)

    def run(self, rows: list[CatchUpRow], loop: DraftLoop) -> torch.Tensor:
        """Drafts [n, k] on the device after one replay of `loop` (row i's first rows[i].limit are its drafts);
        every row's count is at most the loop's query_len."""
        batch, last = catch_up_batch(rows, self.block_size)
        return loop.run(batch, last, batch.positions[last], [r.limit for r in rows])


def catch_up_batch(rows: list[CatchUpRow], block_size: int) -> tuple[CatchUp, np.ndarray]:
    """The rows' catch-ups as one flat batch (numpy fields), and the flat index of each row's last token."""
    starts, positions, row_of = _flat_rows(rows)
    table = block_table([r.block_ids for r in rows])
    last = starts[1:] - 1  # each row's last token; its position is the row's base
    ids = itertools.chain.from_iterable(r.token_ids[r.start + 1:r.start + 1 + r.count] for r in rows)
    batch = CatchUp(input_ids=np.fromiter(ids, dtype=np.int64, count=len(positions)), positions=positions,
                    slot_mapping=slot_mapping(table, row_of, positions, block_size), query_start_loc=starts,
                    seq_lens=positions[last] + 1, block_tables=table)
    return batch, last


def _flat_rows(rows: list[CatchUpRow]) -> tuple[np.ndarray, ...]:
    """(query starts [n + 1], head positions [T], row of each token [T]) of the rows' tokens."""
    counts = np.fromiter((r.count for r in rows), dtype=np.int64, count=len(rows))
    starts = np.concatenate(([0], np.cumsum(counts)))
    row_of = np.repeat(np.arange(len(rows)), counts)
    first = np.fromiter((r.start for r in rows), dtype=np.int64, count=len(rows))
    return starts, first[row_of] + np.arange(starts[-1]) - starts[row_of], row_of
