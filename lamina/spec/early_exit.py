"""Early-exit self-speculation (issue #12): the target's first L' layers, then its final norm and LM head, draft.

No weights and no KV of its own: the drafter is the target model stopped after `exit_layer` layers, and it
reads and writes the KV of those first L' layers in the target's own cache (already bound to the model's
attention layers). One request, N = len(token_ids), k = num_drafts (the target has KV for [0, N - 1)):

    position:     0 ...  N - 2 | N - 1     N         ...  N - 2 + k  | N - 1 + k
    token fed:    (target KV)  | newest    draft 0   ...  draft k - 2 | (never fed)
    drafted:                   | draft 0   draft 1   ...  draft k - 1 |
    layers < L':  read only    | written, one flat forward per column |  untouched
    block_ids:    cover [0, N - 1 + k); slot(p) = block_ids[p // block_size] * block_size + p % block_size

Draft step s feeds, for every request with k > s, one token at position p = N - 1 + s (seq_len p + 1)
through the first L' layers (writing their K/V at p), norm + LM head -> draft s: the argmax, or a sample drawn
with the noise of the row that verifies it (lamina/spec/draft_sampling.py). The verifier later writes every
layer's KV at N - 1 and after, so the first layers' slots there need no rollback; positions < N - 1 and
blocks outside `block_ids` are never written. With CUDA graphs (compile_and_capture) the whole call, every
step, is one replay of a DraftLoop (lamina/spec/draft_loop.py) over these layers.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from lamina.attention.metadata import AttentionMetadata, set_attention_metadata
from lamina.models.common import CausalLM
from lamina.spec.draft_loop import CatchUp, DraftLoop, ModelNet, block_table
from lamina.spec.draft_sampling import DraftKeys, DraftPicker
from lamina.spec.model_proposer import DraftRequest, Drafts

__all__ = ["EarlyExitProposer", "resolve_exit_layer"]


def resolve_exit_layer(exit_layer: int | None, num_layers: int) -> int:
    """`exit_layer`, or by default a third of `num_layers` (at least 1); ValueError outside [1, num_layers - 1]."""
    layer = max(1, num_layers // 3) if exit_layer is None else exit_layer
    if not 1 <= layer < num_layers:
        raise ValueError(f"speculative_config.exit_layer must be in [1, {num_layers - 1}] (the target has "
                         f"{num_layers} layer(s); early exit drafts with fewer than all of them), got {layer!r}")
    return layer


class EarlyExitProposer:
    """A `ModelProposer` drafting greedily with the target's first `exit_layer` layers (module docstring)."""

    uses_hidden = False  # propose does not read `hidden`

    def __init__(self, model: CausalLM, exit_layer: int | None, block_size: int) -> None:
        self.model = model
        self.exit_layer = resolve_exit_layer(exit_layer, model.arch.num_hidden_layers)
        self.block_size = block_size
        self.device = next(model.parameters()).device
        self.loop: DraftLoop | None = None  # set by compile_and_capture

    def kv_bytes_per_block(self, block_size: int) -> int:
        return 0  # it writes the target's own KV

    def bind_cache(self, num_blocks: int, block_size: int) -> None:
        pass  # the target's caches are already bound to the layers it runs

    def forget(self, req_ids: Iterable[str]) -> None:
        pass  # nothing is kept between steps

    def compile_and_capture(self, max_batch_size: int, max_model_len: int, num_drafts: int,
                            warm_up: Callable[[torch.nn.Module], None] | None, graph_cls: type | None = None) -> None:
        """The target's layers are compiled already; with graphs (max_batch_size > 0) capture the propose call."""
        if max_batch_size == 0:
            return
        kwargs = {} if graph_cls is None else {"graph_cls": graph_cls}
        self.loop = DraftLoop(ModelNet(self.model, self.exit_layer), num_drafts, max_batch_size, max_model_len,
                              self.block_size, self.device, **kwargs)
        self.loop.capture_all()

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest], hidden: torch.Tensor) -> Drafts:
        """Up to `num_drafts` drafts per request, on the device; `hidden` is not needed (the drafter
        recomputes)."""
        if not requests:
            return Drafts.empty(0, self.device)
        for request in requests:
            self._check_blocks(request)
        max_drafts = max(r.num_drafts for r in requests)
        width = max(len(r.block_ids) for r in requests)
        if self.loop is not None and self.loop.fits(len(requests), width, max_drafts):
            return self._propose_in_graph(requests)
        pick = DraftPicker(DraftKeys.of(requests, max_drafts), self.device)
        drafts = torch.zeros(len(requests), max_drafts, dtype=torch.int64, device=self.device)
        rows = list(range(len(requests)))  # the requests still drafting, in batch order
        ids = torch.tensor([r.token_ids[-1] for r in requests], dtype=torch.int64, device=self.device)
        tables = self._block_tables(requests)
        for step in range(max_drafts):
            keep = [j for j, i in enumerate(rows) if requests[i].num_drafts > step]
            if len(keep) < len(rows):  # some requests have all their drafts: drop their rows
                rows = [rows[j] for j in keep]
                ids = ids[torch.tensor(keep, device=self.device)]
                pick = DraftPicker(DraftKeys.of([requests[i] for i in rows], max_drafts), self.device)
            ids = pick(self._draft_step([requests[i] for i in rows], step, ids, tables[rows]), step)
            drafts[rows, step] = ids
        return Drafts.per_request(drafts, [r.num_drafts for r in requests])

    def _propose_in_graph(self, requests: list[DraftRequest]) -> Drafts:
        """One replay: the catch-up feeds each newest token at N - 1, the steps the drafts after it."""
        bs, n = self.block_size, len(requests)
        positions = [len(r.token_ids) - 1 for r in requests]
        batch = CatchUp(input_ids=[int(r.token_ids[-1]) for r in requests], positions=positions,
                        slot_mapping=[r.block_ids[p // bs] * bs + p % bs for r, p in zip(requests, positions)],
                        query_start_loc=list(range(n + 1)), seq_lens=[p + 1 for p in positions],
                        block_tables=block_table([r.block_ids for r in requests]).tolist())
        out = self.loop.run(batch, list(range(n)), positions, [r.num_drafts for r in requests],
                            DraftKeys.of(requests, self.loop.k))
        return Drafts.per_request(out, [r.num_drafts for r in requests])

    def _draft_step(self, requests: list[DraftRequest], step: int, ids: torch.Tensor, tables: torch.Tensor
                    ) -> torch.Tensor:
        """Feed `ids` (one token a request) at position N - 1 + step; returns each request's logits."""
        positions = [len(r.token_ids) - 1 + step for r in requests]
        metadata = self._metadata(requests, positions, tables)
        with set_attention_metadata(metadata):
            position_ids = torch.tensor(positions, dtype=torch.int64, device=self.device)
            hidden = self.model.forward_layers(ids, position_ids, self.exit_layer)
        return self.model.compute_logits(hidden)

    def _metadata(self, requests: list[DraftRequest], positions: list[int], tables: torch.Tensor
                  ) -> AttentionMetadata:
        """A decode batch: one query token a request at `positions`, seq_len = position + 1."""
        bs = self.block_size
        slots = [r.block_ids[p // bs] * bs + p % bs for r, p in zip(requests, positions)]
        starts = list(range(len(requests) + 1))
        seq_lens = [p + 1 for p in positions]
        return AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=self.device),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=self.device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=self.device),
            block_tables=tables, max_query_len=1, max_seq_len=max(seq_lens),
            query_start_loc_cpu=starts, seq_lens_cpu=seq_lens)

    def _block_tables(self, requests: list[DraftRequest]) -> torch.Tensor:
        """[B, W] int32 on the device: block_table."""
        return torch.from_numpy(block_table([r.block_ids for r in requests])).to(self.device)

    def _check_blocks(self, request: DraftRequest) -> None:
        """The blocks must cover every position drafting writes: [0, N - 1 + num_drafts)."""
        needed = len(request.token_ids) - 1 + request.num_drafts
        if request.num_drafts < 1 or len(request.block_ids) * self.block_size < needed:
            raise ValueError(f"request {request.req_id!r}: {len(request.block_ids)} block(s) of {self.block_size} "
                             f"do not cover positions [0, {needed}) for num_drafts={request.num_drafts} (>= 1)")

