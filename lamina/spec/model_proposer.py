"""ModelProposer: the worker-side interface of the proposers that run a network (draft model, Medusa, early exit).

The n-gram proposer (lamina/spec/proposer.py) runs in the engine on token ids alone. A proposer with weights
runs in the worker, on the device, right after a step's tokens are known: the worker hands it each drafting
request's verified tokens and block table, and the target's last hidden state of each. The drafts stay on the
device (`Drafts`): the step's answer says only how many each request has (ModelRunnerOutput.num_drafts), the
engine trims that count to its own limits, and the next step's input ids take them from the device (no host
read between drafting and verifying them, as in vLLM's and SGLang's EAGLE paths).

One request, after step t (N = len(token_ids); the target has KV for positions [0, N - 1)):

    token ids:   | prompt ... | outputs ... | newest |            newest: sampled by step t, no KV yet
    position:    0                           N - 1
    block_ids:   cover positions [0, N - 1 + num_drafts)  (the scheduler reserved the lookahead slots)
    hidden:      the target's final hidden state (after its last norm, the LM head's input) at the position
                 whose logits sampled `newest`, i.e. at position N - 2
    drafts:      guesses of the tokens at positions N, N + 1, ..., N - 1 + num_drafts

A proposer may write KV at positions [0, N - 1 + num_drafts) of its own cache (draft model: its own tensors,
indexed by the same block ids; early exit: the target's first layers, whose slots at N - 1 and after the
verifier writes again). Drafts never decide the output (the verify step does: lamina/layers/accept_drafts.py),
so a proposer's only duty to correctness is to write no KV outside these blocks.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

__all__ = ["DraftRequest", "Drafts", "ModelProposer"]


@dataclass(slots=True)
class DraftRequest:
    """One request to draft for, in the layout of the module docstring."""

    req_id: str
    token_ids: Sequence[int]  # prompt + verified outputs; the last is the newest token
    block_ids: list[int]  # the target's block table, covering positions [0, len(token_ids) - 1 + num_drafts)
    num_drafts: int  # >= 1: how many drafts to return at most
    # how its drafts are drawn (lamina/spec/draft_sampling.py): with the key of its samples (the worker's
    # BatchState.seed) and its temperature, top-p and min-p; no key or temperature 0: the argmax
    seed: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    min_p: float = 0.0


@dataclass
class Drafts:
    """What one `propose` call drafted, on the device: request i's drafts are token_ids[rows[i], :counts[i]]
    (counts[i] == 0: none; rows[i] is then unused). Nothing is read to the host: the worker gathers the drafts it
    verifies on the device (`flat_indices`: lamina/worker/drafter.py), and `tolist()` (tests, tools) reads them
    all."""

    token_ids: torch.Tensor  # [R, W] int64
    rows: list[int]
    counts: list[int]

    def __post_init__(self) -> None:
        self.token_ids = self.token_ids.contiguous()  # flat_indices index its rows in order

    @classmethod
    def empty(cls, num_requests: int, device: torch.device) -> Drafts:
        return cls(torch.zeros((0, 0), dtype=torch.int64, device=device), [0] * num_requests, [0] * num_requests)

    @classmethod
    def per_request(cls, token_ids: torch.Tensor, counts: Sequence[int]) -> Drafts:
        """Row i holds request i's drafts."""
        return cls(token_ids, list(range(len(counts))), list(counts))

    @classmethod
    def of_rows(cls, token_ids: torch.Tensor, num_requests: int, indices: Sequence[int],
                counts: Sequence[int]) -> Drafts:
        """Row r holds the drafts of request indices[r] (counts[r] of them); the other requests have none."""
        rows, per_request = [0] * num_requests, [0] * num_requests
        for row, (index, count) in enumerate(zip(indices, counts)):
            rows[index], per_request[index] = row, count
        return cls(token_ids, rows, per_request)

    def flat_indices(self, request: int, count: int) -> range:
        """The indices in token_ids.view(-1) of request `request`'s first `count` drafts (count <= its count)."""
        if not 0 <= count <= self.counts[request]:
            raise ValueError(f"request {request} has {self.counts[request]} draft(s), {count} asked")
        start = self.rows[request] * self.token_ids.shape[1]
        return range(start, start + count)

    def tolist(self) -> list[list[int]]:
        """Every request's drafts on the host (one read)."""
        table = self.token_ids.tolist()
        return [table[row][:count] if count else [] for row, count in zip(self.rows, self.counts)]


@runtime_checkable
class ModelProposer(Protocol):
    """Drafts from a network on the worker's device.

    - `propose(requests, hidden)` returns `Drafts`: for each request, in order, at most `num_drafts` token ids
      (fewer, even none, is allowed), left on the device (no host sync). `hidden` [len(requests), hidden_size]
      holds the target's last hidden state of each request (module docstring), on the device, in the target's
      dtype; a proposer whose `uses_hidden` is False gets an empty [0, hidden_size] tensor instead (the worker
      skips gathering it).
    - `forget(req_ids)`: these requests finished or were preempted; drop what is kept for them (a preempted
      request comes back with its blocks recomputed, possibly other block ids).
    - `kv_bytes_per_block(block_size)`: device bytes the proposer's own KV needs per KV block id (0 when it
      keeps none); the worker sizes the block pool with target + proposer bytes per block, so one block
      id always has room in both.
    - `bind_cache(num_blocks, block_size)`: allocate that KV (called once, before the first `propose`).
    - `compile_and_capture(max_batch_size, max_model_len, num_drafts, warm_up)`: called once after `bind_cache`,
      before the first request: a proposer with a network of its own compiles its kernels with `warm_up(net)`
      (None: nothing to compile) and, when max_batch_size > 0 (the worker captures CUDA graphs), captures its
      drafting for batches of up to max_batch_size requests asking at most num_drafts drafts.
    """

    uses_hidden: bool

    def propose(self, requests: list[DraftRequest], hidden: torch.Tensor) -> Drafts:
        ...

    def forget(self, req_ids: Iterable[str]) -> None:
        ...

    def kv_bytes_per_block(self, block_size: int) -> int:
        ...

    def bind_cache(self, num_blocks: int, block_size: int) -> None:
        ...

    def compile_and_capture(self, max_batch_size: int, max_model_len: int, num_drafts: int,
                            warm_up: Callable[[torch.nn.Module], None] | None) -> None:
        ...
