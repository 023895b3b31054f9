"""Flatten one SchedulerOutput, over the worker's copies of its requests (BatchState), into the inputs a
forward needs: first as host lists (`HostBatch`), then as device tensors (`InputBatch`) in two copies.

    request r, scheduled q tokens, context c = num_computed_tokens, tokens = r's token ids + its drafts:
      input_ids   += tokens[c : c + q]          positions += [c, c + q)
      slot_mapping += block_ids[p // bs] * bs + p % bs   for p in [c, c + q)
      seq_lens    += c + q
      logits index = last flattened token of r, only if c + q reaches the end of r's tokens; with k drafts,
                     the last k + 1 (row j predicts draft j, the last row the bonus token)
      sample position = c + q - k: the index in r's tokens of the first token it samples (keys its draw)
      prompt_logprobs (asked, no output yet): one more logits row per position p in [c, min(c + q, P - 1)),
                     scoring prompt token p + 1 (P = prompt length); these rows follow ALL the sampling rows
                     in logits_indices (PromptRows), so the sampling code sees only its own rows
    a decode_ahead step: one token at position c (q = 1), input id 0 until the model runner writes the
    in-flight step's sample there; it always samples
    a step launched on a guess (lamina/step.py's Guess): r's tokens are its token ids up to guess.start, then
    the guess's tokens (the in-flight step's drafts and the token guessed after them), then its drafts
    drafts the drafter holds on the device (lamina/step.py's DRAFT_ON_DEVICE): placeholder input ids until the
    model runner writes the drafts there on the device (DevicePatch)
    tree drafts (the first m nodes of a DraftTree): node i at position c + q - 1 - m + depth(i) (its slot stays
    that of c + q - m + i), seeing the keys up to the root and its ancestors (a TreeMask over the whole batch: the
    other tokens causal)

The device copy packs the int64 lists (ids, positions, slots, logits rows) into one host array and
the int32 ones (query starts, seq lens, block tables) into another, each field 16-byte aligned: two
non-blocking host-to-device copies per step, and no host wait for the GPU.
Decode steps that replay a CUDA graph skip `InputBatch` and copy the `HostBatch` straight into the
graph's static buffers (lamina/worker/cuda_graphs.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from lamina.attention.metadata import AttentionMetadata, TreeMask
from lamina.device import packed_to_device
from lamina.spec.draft_tree import DraftTree
from lamina.step import Guess, SchedulerOutput
from lamina.worker.batch_state import BatchState, RequestState


@dataclass
class PromptRows:
    """The prompt-logprob rows of a step, after the sampling rows: request i scores its prompt tokens
    [starts[i], starts[i] + counts[i]), whose ids are target_ids (flat), with the top num_logprobs[i]."""

    req_ids: list[str] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    num_logprobs: list[int] = field(default_factory=list)
    target_ids: list[int] = field(default_factory=list)
    flat_indices: list[int] = field(default_factory=list)  # the rows' token indices in the flat batch

    def add(self, req_id: str, prompt: list[int], num_logprobs: int, start: int, end: int, base: int) -> None:
        """Request `req_id` computes positions [start, end) from flat index `base`: score what they predict."""
        last = min(end, len(prompt) - 1)
        if last <= start:
            return
        self.req_ids.append(req_id)
        self.starts.append(start + 1)
        self.counts.append(last - start)
        self.num_logprobs.append(num_logprobs)
        self.target_ids += prompt[start + 1:last + 1]
        self.flat_indices += range(base, base + last - start)


@dataclass
class HostBatch:
    """One step's inputs as Python lists, in the layout of the module docstring."""

    input_ids: list[int]  # [T]
    positions: list[int]  # [T]
    slot_mapping: list[int]  # [T]
    query_start_loc: list[int]  # [B + 1]
    seq_lens: list[int]  # [B]
    block_tables: list[list[int]]  # [B][W]: each request's block ids, padded with 0 to the widest
    logits_indices: list[int]  # [S]
    sampling_req_ids: list[str]  # the S requests that sample a token this step
    sample_positions: list[int] = field(default_factory=list)  # [S]: index of the first token each one samples
    num_draft_tokens: list[int] = field(default_factory=list)  # [S]: k, drafts verified (k + 1 logits rows)
    draft_token_ids: list[int] = field(default_factory=list)  # the drafts, flat, in row order
    prompt_rows: PromptRows | None = None  # prompt_logprobs: their rows end logits_indices
    tree_mask: tuple[list[int], list[int]] | None = None  # tree drafts: TreeMask's ctx and bits of every token

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def max_query_len(self) -> int:
        starts = self.query_start_loc
        return max(b - a for a, b in zip(starts, starts[1:]))

    @property
    def is_decode_only(self) -> bool:
        """Every request has exactly one new token this step (a decode, or a one-token prompt chunk)."""
        return len(self.input_ids) == self.num_seqs


@dataclass
class DevicePatch:
    """Input ids that only the device has (the drafts the drafter holds): ids[index[i]] = values[i]."""

    index: torch.Tensor  # [D] int64
    values: torch.Tensor  # [D] int64

    def apply(self, input_ids: torch.Tensor) -> None:
        input_ids.index_copy_(0, self.index, self.values)


@dataclass
class InputBatch:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    attn_metadata: AttentionMetadata
    logits_indices: torch.Tensor  # [S]: rows of the hidden states to turn into logits


def _token_slice(tokens: list[int], drafts: list[int], start: int, end: int) -> list[int]:
    if end <= len(tokens):
        return tokens[start:end]
    return (tokens + drafts)[start:end]


def _guessed_slice(state: RequestState, guess: Guess, drafts: list[int], start: int, end: int) -> list[int]:
    """Input ids of a request of a step launched on a guess: its tokens end where the guess starts (the step
    before is not read yet), and the step starts at the guess's last token."""
    if guess.start != state.num_tokens or not guess.start <= start < guess.end:
        raise ValueError(f"guesses: request {state.req_id!r}'s guess covers [{guess.start}, {guess.end}) but the "
                         f"worker holds {state.num_tokens} tokens and the step starts at {start}")
    return (guess.token_ids + drafts)[start - guess.start:end - guess.start]


def _tree_rows(tree: DraftTree, m: int, end: int, positions: list[int], ctx: list[int], bits: list[int]) -> None:
    """The request's last m tokens are the tree's first m nodes: at their depths' positions, seeing the keys up to
    the root (end - 1 - m) and their ancestors."""
    root = end - 1 - m
    positions[len(positions) - m:] = [root + d for d in tree.depths[:m]]
    ctx[len(ctx) - m:] = [root + 1] * m
    bits[len(bits) - m:] = [tree.ancestor_bits(i) for i in range(m)]


def plan_batch(scheduled: SchedulerOutput, states: BatchState, block_size: int,
               tree: DraftTree | None = None) -> HostBatch:
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start = [0]
    seq_lens: list[int] = []
    logits_indices: list[int] = []
    sampling: list[str] = []
    sample_positions: list[int] = []
    num_drafts: list[int] = []
    draft_ids: list[int] = []
    tables: list[list[int]] = []
    prompt_rows = PromptRows()
    drafts, held, guesses = scheduled.scheduled_spec_decode_tokens, states.requests, scheduled.guesses
    tree = tree if drafts else None  # a step without drafts attends causally
    ctx: list[int] = []  # tree drafts: TreeMask's rows, the causal ones too
    bits: list[int] = []
    for req_id in scheduled.req_ids:
        state = held[req_id]
        start = state.num_computed_tokens
        end = start + scheduled.num_scheduled_tokens[req_id]
        guess = guesses.get(req_id) if guesses else None
        num_tokens = state.num_tokens if guess is None else guess.end  # its tokens, the guessed ones too
        if scheduled.decode_ahead:  # the token the step in flight samples: the runner fills in its id
            input_ids.append(0)
        elif guess is not None:
            input_ids += _guessed_slice(state, guess, drafts.get(req_id, []), start, end)
        else:
            input_ids += _token_slice(state.token_ids, drafts.get(req_id, []), start, end)
        params = state.sampling_params
        if params.prompt_logprobs is not None and state.num_output_tokens == 0 and not scheduled.decode_ahead:
            prompt = state.token_ids[:state.num_prompt_tokens]
            prompt_rows.add(req_id, prompt, params.prompt_logprobs, start, end, len(input_ids) - (end - start))
        blocks = state.block_ids
        tables.append(blocks)
        if end - start == 1:  # a decode: the common case, kept cheap
            positions.append(start)
            slots.append(blocks[start // block_size] * block_size + start % block_size)
        else:
            positions += range(start, end)
            slots += [blocks[pos // block_size] * block_size + pos % block_size for pos in range(start, end)]
        query_start.append(len(input_ids))
        seq_lens.append(end)
        if tree is not None:
            ctx += range(start + 1, end + 1)
            bits += [0] * (end - start)
        if end >= num_tokens or scheduled.decode_ahead:
            verified = drafts.get(req_id, [])[:end - num_tokens]
            logits_indices.extend(range(len(input_ids) - 1 - len(verified), len(input_ids)))
            sampling.append(req_id)
            sample_positions.append(end - len(verified))
            num_drafts.append(len(verified))
            draft_ids += verified
            if tree is not None and verified:
                _tree_rows(tree, len(verified), end, positions, ctx, bits)
    width = max(len(t) for t in tables)
    tables = [t + [0] * (width - len(t)) for t in tables]
    logits_indices += prompt_rows.flat_indices
    return HostBatch(input_ids, positions, slots, query_start, seq_lens, tables, logits_indices, sampling,
                     sample_positions, num_drafts, draft_ids, prompt_rows if prompt_rows.req_ids else None,
                     (ctx, bits) if any(bits) else None)


def to_device(host: HostBatch, device: torch.device) -> InputBatch:
    """Two packed non-blocking copies (int64, int32), then views. numpy builds the host arrays: it is
    several times faster than torch.tensor on Python lists (the block tables are the big part)."""
    num_seqs, width = host.num_seqs, len(host.block_tables[0])
    ids, positions, slots, logits_indices = packed_to_device(
        [np.array(f, dtype=np.int64) for f in (host.input_ids, host.positions, host.slot_mapping,
                                                host.logits_indices)], np.int64, device)
    query_start, seq_lens, tables = packed_to_device(
        [np.array(host.query_start_loc, dtype=np.int32), np.array(host.seq_lens, dtype=np.int32),
         np.array(host.block_tables, dtype=np.int32).ravel()], np.int32, device)
    metadata = AttentionMetadata(
        slot_mapping=slots, query_start_loc=query_start, seq_lens=seq_lens,
        block_tables=tables.view(num_seqs, width), max_query_len=host.max_query_len,
        max_seq_len=max(host.seq_lens), query_start_loc_cpu=host.query_start_loc, seq_lens_cpu=host.seq_lens,
        tree_mask=None if host.tree_mask is None else TreeMask.of(*host.tree_mask, device))
    return InputBatch(input_ids=ids, positions=positions, attn_metadata=metadata, logits_indices=logits_indices)
