"""Attention metadata for one flat batch, and the context that hands it to the attention layers.

A batch is B requests laid end to end (no padding):

    tokens:           | r0: q0 tokens | r1: q1 tokens | ... |
    query_start_loc:  0              q0            q0+q1  ...  T      (B + 1 entries)
    seq_lens[i]:      context length of request i after this step (cached prefix + new tokens);
                      its new tokens sit at positions [seq_lens[i] - q_i, seq_lens[i])
    slot_mapping[t]:  block_id * block_size + offset where token t's K/V is stored; -1 = don't store
    block_tables[i]:  the block ids of request i, padded with 0 (the null block)

One forward serves prefill, decode and mixed batches: a decode is simply q_i == 1.

tree_mask (tree drafts, lamina/spec/draft_tree.py), in place of the causal rule: query token t sees the keys
[0, ctx[t]) of its sequence and key ctx[t] + b for each bit b of bits[t] (b < 63); a causal token has
ctx = its own key's index + 1 and no bits.

What every layer of one forward derives alike from the metadata (the torch path's gather indices and masks)
is made once, by the first layer that asks (`AttentionMetadata.memo`), and forgotten when a forward enters
`set_attention_metadata`: a captured forward's metadata tensors are static buffers, refilled in place between
replays. Outside that context nothing is kept.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

T = TypeVar("T")


@dataclass
class TreeMask:
    """Which keys each query token of a flat batch sees (module docstring): on the device for the kernels, on the
    host for the torch path."""

    ctx: torch.Tensor  # [T] int64
    bits: torch.Tensor  # [T] int64
    ctx_cpu: list[int]
    bits_cpu: list[int]
    # (start, end, num_keys) -> `dense`'s mask: every layer of a forward asks for the same ones
    _dense: dict[tuple[int, int, int], torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, ctx: list[int], bits: list[int], device: torch.device | str) -> TreeMask:
        pair = torch.tensor([ctx, bits], dtype=torch.int64).to(device, non_blocking=True)
        return cls(pair[0], pair[1], ctx, bits)

    def dense(self, start: int, end: int, num_keys: int) -> torch.Tensor:
        """[end - start, num_keys] bool: what query tokens [start, end) see (True); made once per forward."""
        if (start, end, num_keys) not in self._dense:
            self._dense[start, end, num_keys] = self._make_dense(start, end, num_keys)
        return self._dense[start, end, num_keys]

    def _make_dense(self, start: int, end: int, num_keys: int) -> torch.Tensor:
        keys = torch.arange(num_keys)
        ctx = torch.tensor(self.ctx_cpu[start:end])[:, None]
        rel = (keys[None, :] - ctx).clamp(0, 62)
        bit = (torch.tensor(self.bits_cpu[start:end])[:, None] >> rel) & 1
        return (keys[None, :] < ctx) | ((keys[None, :] - ctx < 63) & (bit == 1))


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64
    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32
    block_tables: torch.Tensor  # [B, max_blocks_per_seq] int32
    max_query_len: int
    max_seq_len: int
    query_start_loc_cpu: list[int]  # host copies, for per-sequence loops in the reference path
    seq_lens_cpu: list[int]
    tree_mask: TreeMask | None = None  # None: causal (module docstring)
    # the shortest sequence's q_len where query_start_loc_cpu does not give it: a CUDA graph's rows change at every
    # replay (lamina/graphs.py: 1); None: read from query_start_loc_cpu
    min_query_len: int | None = None
    # `memo`'s, this forward's; not an init field, so a dataclasses.replace copy starts with its own
    _memo: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def memo(self, key: Any, make: Callable[[], T]) -> T:
        """make(), once per forward (module docstring): what the layers derive alike from this metadata. Outside
        its set_attention_metadata context (a direct call), made afresh each time."""
        if _current is not self:
            return make()
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    def shortest_query_len(self) -> int:
        if self.min_query_len is not None:
            return self.min_query_len
        starts = self.query_start_loc_cpu
        return min(starts[i + 1] - starts[i] for i in range(self.num_seqs))


def prefill_metadata(lengths: list[int], block_size: int, device: torch.device | str = "cpu") -> AttentionMetadata:
    """Whole prompts of `lengths` tokens laid end to end, nothing cached: prompt i owns consecutive blocks from
    1 on (block 0 is the null block), its tokens stored in order from the first slot of its first block."""
    blocks = [-(-n // block_size) for n in lengths]
    starts = [1 + sum(blocks[:i]) for i in range(len(lengths))]
    table = [list(range(s, s + b)) + [0] * (max(blocks) - b) for s, b in zip(starts, blocks)]
    slots = torch.cat([torch.arange(n) + s * block_size for n, s in zip(lengths, starts)])
    query_start = [0]
    for n in lengths:
        query_start.append(query_start[-1] + n)

    def tensor(values: list[int] | list[list[int]]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)
    return AttentionMetadata(slot_mapping=slots.to(device), query_start_loc=tensor(query_start),
                             seq_lens=tensor(list(lengths)), block_tables=tensor(table), max_query_len=max(lengths),
                             max_seq_len=max(lengths), query_start_loc_cpu=query_start, seq_lens_cpu=list(lengths))


_current: AttentionMetadata | None = None


@contextlib.contextmanager
def set_attention_metadata(metadata: AttentionMetadata | None) -> Iterator[None]:
    """Make `metadata` visible to every attention layer for the duration of one forward."""
    global _current
    if metadata is not None:
        metadata._memo.clear()
    previous, _current = _current, metadata
    try:
        yield
    finally:
        _current = previous


def get_attention_metadata() -> AttentionMetadata:
    if _current is None:
        raise RuntimeError("attention called outside set_attention_metadata(...)")
    return _current
