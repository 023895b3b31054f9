"""Drafter: runs a worker-side proposer (lamina/spec/model_proposer.py) once a step's tokens are known.

    step t:  forward -> logits rows -> samples          hidden [S, H]: the rows that sample, request by request
                                                         (k + 1 rows for a request that verified k drafts)
    result:  tokens of request r = a + 1 (a accepted)   its newest token was sampled by row start_r + a
             DraftRequest(tokens, block table, n)        n = min(draft_limits[r], lookahead its blocks cover)
             proposer.propose(requests, hidden[rows])  -> ModelRunnerOutput.draft_token_ids
"""
from __future__ import annotations

import logging
from collections.abc import Iterable

import torch

from lamina.failures import is_fatal
from lamina.spec.model_proposer import DraftRequest, ModelProposer
from lamina.step import ModelRunnerOutput
from lamina.worker.batch_state import BatchState


logger = logging.getLogger(__name__)


class Drafter:
    def __init__(self, proposer: ModelProposer, block_size: int) -> None:
        self.proposer = proposer
        self.block_size = block_size

    def forget(self, req_ids: Iterable[str]) -> None:
        self.proposer.forget(req_ids)

    @torch.inference_mode()
    def draft(self, limits: dict[str, int], output: ModelRunnerOutput, states: BatchState, hidden: torch.Tensor,
              row_starts: dict[str, int]) -> None:
        """Put the drafts of the requests in `limits` that got tokens into `output.draft_token_ids`. `hidden`:
        the step's sampling rows; `row_starts[r]`: request r's first row in it."""
        requests, rows = self._requests(limits, output, states, row_starts)
        if not requests:
            return
        try:
            drafts = self.proposer.propose(requests, self._hidden(hidden, rows))
        except Exception as err:  # noqa: BLE001 - drafts are optional: the step's tokens stand without them
            if is_fatal(err):
                raise
            logger.warning("drafting failed for %d request(s); they decode without drafts: %r", len(requests), err)
            self.proposer.forget([r.req_id for r in requests])  # their draft KV may be half written
            return
        output.draft_token_ids = {r.req_id: list(d) for r, d in zip(requests, drafts)}

    def _hidden(self, hidden: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """The drafting requests' rows of `hidden`, for a proposer that reads them (else none: no copy, no launch)."""
        if not self.proposer.uses_hidden:
            return hidden[:0]
        return hidden.index_select(0, torch.tensor(rows, dtype=torch.int64).to(hidden.device, non_blocking=True))

    def _requests(self, limits: dict[str, int], output: ModelRunnerOutput | None, states: BatchState,
                  row_starts: dict[str, int]) -> tuple[list[DraftRequest], list[int]]:
        requests, rows = [], []
        for req_id, limit in limits.items():
            tokens = output.sampled_token_ids.get(req_id)
            if not tokens or req_id not in row_starts:
                continue
            state = states.requests[req_id]
            covered = len(state.block_ids) * self.block_size - (state.num_tokens - 1)  # lookahead slots held
            num_drafts = min(limit, covered)
            if num_drafts > 0:
                requests.append(DraftRequest(req_id, state.token_ids, state.block_ids, num_drafts))
                rows.append(row_starts[req_id] + len(tokens) - 1)
        return requests, rows
