"""Drafter: runs a worker-side proposer (lamina/spec/model_proposer.py) once a step's tokens are known.

    step t:  forward -> logits rows -> samples          hidden [S, H]: the rows that sample, request by request
                                                         (k + 1 rows for a request that verified k drafts)
    result:  tokens of request r = a + 1 (a accepted)   its newest token was sampled by row start_r + a
             DraftRequest(tokens, block table, n)        n = min(draft_limits[r], lookahead its blocks cover)
             proposer.propose(requests, hidden[rows])  -> ModelRunnerOutput.draft_token_ids

    EAGLE (a proposer with `propose_fed`): the target's features of every token of every step (StepFeatures,
    a prompt chunk that samples nothing too) feed the head's KV: proposer.propose_fed(feeds, requests, aux)
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from lamina.failures import is_fatal
from lamina.spec.eagle import Feed
from lamina.spec.model_proposer import DraftRequest, ModelProposer
from lamina.step import ModelRunnerOutput
from lamina.worker.batch_state import BatchState
from lamina.worker.input_batch import HostBatch


logger = logging.getLogger(__name__)


@dataclass
class StepFeatures:
    """The target's features (CausalLM.aux_hidden_states) of every token of a step, rows in batch order, and
    each request's first position and token count in it: what an EAGLE head is fed (lamina/spec/eagle.py)."""

    aux: torch.Tensor  # [T, 3 * hidden]
    req_ids: list[str]
    starts: list[int]
    counts: list[int]


class Drafter:
    def __init__(self, proposer: ModelProposer, block_size: int) -> None:
        self.proposer = proposer
        self.block_size = block_size

    def forget(self, req_ids: Iterable[str]) -> None:
        self.proposer.forget(req_ids)

    def features(self, model: torch.nn.Module, req_ids: list[str], host: HostBatch) -> StepFeatures | None:
        """The step's features when the proposer is fed them (EAGLE), else None (no cost)."""
        aux = getattr(model, "aux_hidden_states", None) if hasattr(self.proposer, "propose_fed") else None
        if aux is None:
            return None
        if aux._base is not None:  # a CUDA graph's output: the next replay (a step launched ahead) rewrites it
            aux = aux.clone()
        starts = host.query_start_loc
        return StepFeatures(aux, list(req_ids), [host.positions[a] for a in starts[:-1]],
                            [b - a for a, b in zip(starts, starts[1:])])

    @torch.inference_mode()
    def draft(self, limits: dict[str, int], output: ModelRunnerOutput | None, states: BatchState,
              hidden: torch.Tensor | None, row_starts: dict[str, int], features: StepFeatures | None = None) -> None:
        """Put the drafts of the requests in `limits` that got tokens into `output.draft_token_ids`. `hidden`:
        the step's sampling rows; `row_starts[r]`: request r's first row in it. With `features` (EAGLE), the
        proposer is first fed every position the step computed whose next token is known (a step that samples
        nothing too: output None)."""
        requests, rows = self._requests(limits, output, states, row_starts)
        call: Callable[[], list[list[int]]]
        if features is not None:
            feeds = _feeds(features, states)
            if not feeds:
                return
            call = functools.partial(self.proposer.propose_fed, feeds, requests, features.aux)
        else:
            if not requests:
                return
            index = torch.tensor(rows, dtype=torch.int64).to(hidden.device, non_blocking=True)
            call = functools.partial(self.proposer.propose, requests, hidden.index_select(0, index))
        try:
            drafts = call()
        except Exception as err:  # noqa: BLE001 - drafts are optional: the step's tokens stand without them
            if is_fatal(err):
                raise
            logger.warning("drafting failed for %d request(s); they decode without drafts: %r", len(requests), err)
            self.proposer.forget([r.req_id for r in requests])  # their draft KV may be half written
            return
        if requests:
            output.draft_token_ids = {r.req_id: list(d) for r, d in zip(requests, drafts)}

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


def _feeds(features: StepFeatures, states: BatchState) -> list[Feed]:
    """Per request: the positions of the step whose next token is verified, [start, min(start + q, N - 1))."""
    feeds, row = [], 0
    for req_id, start, count in zip(features.req_ids, features.starts, features.counts):
        state = states.requests.get(req_id)
        if state is not None:
            fed = min(start + count, state.num_tokens - 1) - start
            if fed > 0:
                feeds.append(Feed(req_id, state.token_ids, state.block_ids, start, fed, row))
        row += count
    return feeds
