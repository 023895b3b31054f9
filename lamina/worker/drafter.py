"""Drafter: runs a worker-side proposer (lamina/spec/model_proposer.py) once a step's tokens are known.

    step t:  forward -> logits rows -> samples          hidden [S, H]: the rows that sample, request by request
                                                         (k + 1 rows for a request that verified k drafts)
    result:  tokens of request r = a + 1 (a accepted)   its newest token was sampled by row start_r + a
             DraftRequest(tokens, block table, n)        n = min(draft_limits[r], lookahead its blocks cover)
             proposer.propose(requests, hidden[rows])  -> Drafts, on the device: held here per request;
                                                          their counts -> ModelRunnerOutput.num_drafts
    step t+1: the engine schedules up to that many      take(): the held drafts, flat, on the device (no host
             DRAFT_ON_DEVICE drafts per request                 read), as a patch of the verify step's input ids
"""
from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
import torch

from lamina.device import packed_to_device
from lamina.failures import is_fatal
from lamina.spec.model_proposer import DraftRequest, Drafts, ModelProposer
from lamina.step import ModelRunnerOutput
from lamina.worker.batch_state import BatchState
from lamina.worker.input_batch import DevicePatch


logger = logging.getLogger(__name__)


class Drafter:
    def __init__(self, proposer: ModelProposer, block_size: int) -> None:
        self.proposer = proposer
        self.block_size = block_size
        self.held: dict[str, tuple[Drafts, int]] = {}  # request id -> the drafts of its last propose, its index

    def forget(self, req_ids: Iterable[str]) -> None:
        req_ids = list(req_ids)
        for req_id in req_ids:
            self.held.pop(req_id, None)
        self.proposer.forget(req_ids)

    def take(self, req_ids: list[str], counts: list[int], rows: list[int]) -> DevicePatch:
        """The first counts[i] held drafts of each req_ids[i], flat (sum(counts) of them), as a patch of the step's
        input ids at `rows` (one host-to-device copy of both indices, one gather); they are no longer held.
        RuntimeError if the engine asks for drafts that are not held."""
        offsets: dict[int, int] = {}  # id(drafts) -> where its token ids start in the concatenation
        tables: list[torch.Tensor] = []
        index: list[int] = []
        size = 0
        for req_id, count in zip(req_ids, counts):
            drafts, i = self._held(req_id, count)
            if id(drafts) not in offsets:  # as a rule all come from one propose call
                offsets[id(drafts)], size = size, size + drafts.token_ids.numel()
                tables.append(drafts.token_ids.view(-1))
            index += (offsets[id(drafts)] + j for j in drafts.flat_indices(i, count))
        flat = tables[0] if len(tables) == 1 else torch.cat(tables)
        source, target = packed_to_device([np.array(index, dtype=np.int64), np.array(rows, dtype=np.int64)],
                                          np.int64, flat.device)
        return DevicePatch(target, flat.index_select(0, source))

    def _held(self, req_id: str, count: int) -> tuple[Drafts, int]:
        held = self.held.pop(req_id, None)
        if held is None or held[0].counts[held[1]] < count:
            have = 0 if held is None else held[0].counts[held[1]]
            raise RuntimeError(f"request {req_id!r}: {count} draft(s) on the device scheduled, {have} held "
                               "(this is a bug; please report it)")
        return held

    @torch.inference_mode()
    def draft(self, limits: dict[str, int], output: ModelRunnerOutput, states: BatchState, hidden: torch.Tensor,
              row_starts: dict[str, int]) -> None:
        """Draft for the requests in `limits` that got tokens: hold the drafts, put their counts into
        `output.num_drafts`. `hidden`: the step's sampling rows; `row_starts[r]`: request r's first row in it."""
        requests, rows = self._requests(limits, output, states, row_starts)
        if not requests:
            return
        try:
            drafts = self.proposer.propose(requests, self._hidden(hidden, rows))
        except Exception as err:  # noqa: BLE001 - drafts are optional: the step's tokens stand without them
            if is_fatal(err):
                raise
            logger.warning("drafting failed for %d request(s); they decode without drafts: %r", len(requests), err)
            self.forget([r.req_id for r in requests])  # their draft KV may be half written
            return
        for i, request in enumerate(requests):
            if drafts.counts[i]:
                self.held[request.req_id] = (drafts, i)
            else:
                self.held.pop(request.req_id, None)
        output.num_drafts = {r.req_id: n for r, n in zip(requests, drafts.counts) if n}

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
                params = state.sampling_params
                requests.append(DraftRequest(req_id, state.token_ids, state.block_ids, num_drafts, state.seed,
                                             params.temperature, params.top_p, params.min_p))
                rows.append(row_starts[req_id] + len(tokens) - 1)
        return requests, rows
