"""PenaltyState: per-request repetition / frequency / presence state on the device, updated incrementally.

    counts      [R, V] float32  occurrences of each token in a request's output so far
    prompt_mask [R, V] bool     token occurs in the prompt (only requests with a repetition penalty use it)
    row 0                       all zeros: the row of every request without penalties

A request with penalties gets a row when the worker first holds it (its outputs so far counted once, in
one scatter), the row is bumped on the device from each token it samples (no host round trip), and the
row is recycled when the request is dropped. Rows grow by doubling; nothing is allocated until a request
with penalties arrives.
"""
from __future__ import annotations

import torch

from lamina.layers.sampling_metadata import PenaltyTensors, host_to_device
from lamina.sampling_params import SamplingParams

_ZERO_ROW = 0


class PenaltyState:
    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.counts: torch.Tensor | None = None
        self.prompt_mask: torch.Tensor | None = None
        self._row: dict[str, int] = {}
        self._free: list[int] = []

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._row

    def add(self, req_id: str, prompt_ids: list[int], output_ids: list[int], params: SamplingParams) -> None:
        if not params.has_penalties:
            return
        row = self._take_row()
        self._row[req_id] = row
        self.counts[row].zero_()
        self.prompt_mask[row].zero_()
        if output_ids:
            ids = host_to_device(output_ids, torch.int64, self.device)
            self.counts[row].index_add_(0, ids, torch.ones(ids.shape, dtype=torch.float32, device=self.device))
        if params.repetition_penalty != 1.0 and prompt_ids:
            self.prompt_mask[row, host_to_device(prompt_ids, torch.int64, self.device)] = True

    def remove(self, req_id: str) -> None:
        row = self._row.pop(req_id, None)
        if row is not None:
            self._free.append(row)

    def tensors(self, req_ids: list[str], params: list[SamplingParams]) -> PenaltyTensors | None:
        """The step's penalty tensors, row i for req_ids[i]; None when no request in it has penalties."""
        if not self._row or not any(req_id in self._row for req_id in req_ids):
            return None
        rows = host_to_device([self._row.get(r, _ZERO_ROW) for r in req_ids], torch.int64, self.device)
        repetition = [p.repetition_penalty for p in params]
        return PenaltyTensors(
            repetition_penalties=host_to_device(repetition, torch.float32, self.device),
            frequency_penalties=host_to_device([p.frequency_penalty for p in params], torch.float32, self.device),
            presence_penalties=host_to_device([p.presence_penalty for p in params], torch.float32, self.device),
            output_token_counts=self.counts.index_select(0, rows),
            prompt_token_mask=(self.prompt_mask.index_select(0, rows) if any(r != 1.0 for r in repetition)
                               else None))

    def update(self, req_ids: list[str], sampled: torch.Tensor) -> None:
        """Count the tokens just sampled (`sampled[i]` is req_ids[i]'s, on the device) for requests with rows."""
        if not self._row:
            return
        picked = [(i, self._row[r]) for i, r in enumerate(req_ids) if r in self._row]
        if not picked:
            return
        positions = host_to_device([i for i, _ in picked], torch.int64, self.device)
        rows = host_to_device([row for _, row in picked], torch.int64, self.device)
        ones = torch.ones(len(picked), dtype=torch.float32, device=self.device)
        self.counts.index_put_((rows, sampled.index_select(0, positions)), ones, accumulate=True)

    def _take_row(self) -> int:
        if not self._free:
            self._grow()
        return self._free.pop()

    def _grow(self) -> None:
        old = 0 if self.counts is None else self.counts.shape[0]
        new = max(8, 2 * old)
        counts = torch.zeros(new, self.vocab_size, dtype=torch.float32, device=self.device)
        mask = torch.zeros(new, self.vocab_size, dtype=torch.bool, device=self.device)
        if self.counts is not None:
            counts[:old].copy_(self.counts)
            mask[:old].copy_(self.prompt_mask)
        self.counts, self.prompt_mask = counts, mask
        self._free.extend(reversed(range(max(old, _ZERO_ROW + 1), new)))
