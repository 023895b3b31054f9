"""Drive a lamina model through the paged KV cache by hand, the way the model runner does.

    runner = PagedRunner(model, arch, block_size=4, num_blocks=64)
    logits = runner.step({"a": prompt[:5], "b": other})   # one flat forward, two sequences
    logits = runner.step({"a": prompt[5:]})               # "a" continues: attends to its cached prefix

Blocks are handed out sequentially from 1 (block 0 is the null block) and never freed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lamina.attention.metadata import AttentionMetadata, set_attention_metadata
from lamina.config import ModelArch
from lamina.kv.cache import allocate_kv_caches, bind_kv_caches
from lamina.models.common import CausalLM


@dataclass
class SeqState:
    block_ids: list[int] = field(default_factory=list)
    num_computed: int = 0


def build_metadata(seqs: list[tuple[list[int], int, int]], block_size: int,
                   device: torch.device | str = "cpu") -> AttentionMetadata:
    """Metadata for a flat batch; seqs[i] = (block_ids, num_computed, num_new) of sequence i."""
    slots: list[int] = []
    starts = [0]
    seq_lens = []
    for block_ids, num_computed, num_new in seqs:
        for pos in range(num_computed, num_computed + num_new):
            slots.append(block_ids[pos // block_size] * block_size + pos % block_size)
        starts.append(starts[-1] + num_new)
        seq_lens.append(num_computed + num_new)
    width = max(len(b) for b, _, _ in seqs)
    tables = [b + [0] * (width - len(b)) for b, _, _ in seqs]
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
        max_query_len=max(n for _, _, n in seqs), max_seq_len=max(seq_lens),
        query_start_loc_cpu=starts, seq_lens_cpu=seq_lens)


class PagedRunner:
    """Owns a KV cache for `model` and runs flat batches of per-sequence chunks through it."""

    def __init__(self, model: CausalLM, arch: ModelArch, block_size: int = 4, num_blocks: int = 64,
                 dtype: torch.dtype | None = None, device: torch.device | str = "cpu") -> None:
        self.model, self.block_size, self.device = model, block_size, device
        dtype = dtype or next(model.parameters()).dtype
        bind_kv_caches(model, allocate_kv_caches(arch, num_blocks, block_size, dtype, device))
        self.num_blocks = num_blocks
        self.next_block = 1
        self.seqs: dict[str, SeqState] = {}

    def _grow(self, state: SeqState, num_tokens: int) -> None:
        while len(state.block_ids) * self.block_size < num_tokens:
            if self.next_block >= self.num_blocks:
                raise RuntimeError("PagedRunner is out of KV blocks; pass a larger num_blocks")
            state.block_ids.append(self.next_block)
            self.next_block += 1

    @torch.no_grad()
    def step(self, chunks: dict[str, list[int]]) -> dict[str, torch.Tensor]:
        """One forward over all chunks; returns float32 logits [len(chunk), vocab] per sequence."""
        ids, positions, seqs = [], [], []
        for seq_id, tokens in chunks.items():
            state = self.seqs.setdefault(seq_id, SeqState())
            self._grow(state, state.num_computed + len(tokens))
            ids += tokens
            positions += range(state.num_computed, state.num_computed + len(tokens))
            seqs.append((state.block_ids, state.num_computed, len(tokens)))
        metadata = build_metadata(seqs, self.block_size, self.device)
        with set_attention_metadata(metadata):
            hidden = self.model(torch.tensor(ids, device=self.device), torch.tensor(positions, device=self.device))
        logits = self.model.compute_logits(hidden)
        out, start = {}, 0
        for seq_id, tokens in chunks.items():
            out[seq_id] = logits[start:start + len(tokens)]
            start += len(tokens)
            self.seqs[seq_id].num_computed += len(tokens)
        return out
