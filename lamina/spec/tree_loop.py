"""TreeLoop: a draft model's tree drafts (lamina/spec/draft_tree.py) in one CUDA graph per batch bucket, as DraftLoop
(lamina/spec/draft_loop.py) runs a chain's.

    catch-up   DraftLoop's: the logits at each row's last token (position base) pick the root's children
    level d    1 <= d < depth: one forward of the tree's fed nodes of depth d (those with children), the same in
               every row, F_d tokens a row: node i at position base + d, in the slot of base + 1 + i (-1 unless
               i + 1 < the row's limit: it stores nothing), seeing keys [0, base + 1) and its ancestors (TreeMask)
    children   a parent's c children: `ranked` on its logits with the key of the token after it
    output     drafts [b, size] in node order; row i's first limit[i] are its drafts

Every row computes the whole tree (static shapes); a row's nodes past its limit write no KV and are not returned.
The per-call inputs (each fed node's position, slot and TreeMask ctx, each level's seq lens, the keys) are made on
the host and copied with the catch-up's (`run`).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np
import torch

from lamina.attention.metadata import AttentionMetadata, TreeMask, set_attention_metadata
from lamina.graphs import FlatBatch, Graph, StaticBuffers, TorchCUDAGraph, bucket_for, capture_buckets, graph_buckets
from lamina.spec.draft_loop import ModelNet
from lamina.spec.draft_sampling import DraftKeys, ranked, sampling_kernels
from lamina.spec.draft_tree import DraftTree

logger = logging.getLogger(__name__)


class TreeLoop:
    def __init__(self, net: ModelNet, tree: DraftTree, max_batch_size: int, max_model_len: int, block_size: int,
                 device: torch.device, graph_cls: type = TorchCUDAGraph) -> None:
        self.net, self.tree = net, tree
        self.k = tree.depth  # draft levels; DraftKeys of this many tokens; catch-ups of up to k + 1 tokens a row
        self.query_len = self.k + 1
        self.buckets = graph_buckets(max_batch_size)
        self.max_model_len, self.block_size, self.device, self.graph_cls = max_model_len, block_size, device, graph_cls
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.fed = [[i for i in level if tree.children(i, tree.size)] for level in tree.levels(tree.size)[:-1]]
        rows = self.buckets[-1]
        self.buffers = StaticBuffers.allocate(rows, self.max_blocks_per_seq, device, query_len=self.query_len)
        # per row: the catch-up's last index; pos, slot and ctx of each fed node (level order); each level's seq len;
        # the key of each depth's children
        self.num_fed = sum(map(len, self.fed))
        self.rows = torch.zeros(1 + 3 * self.num_fed + len(self.fed) + self.k, rows, dtype=torch.int64, device=device)
        self.params = torch.from_numpy(DraftKeys.argmax_params(rows)).to(device)
        kernels = sampling_kernels(device)
        self.sampled = kernels is not None or device.type != "cuda"  # no torch generators in a CUDA graph
        self.kernels = kernels
        self.graphs: dict[int, Graph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def fits(self, num_rows: int, width: int, most_drafts: int) -> bool:
        return num_rows <= self.buckets[-1] and width <= self.max_blocks_per_seq and most_drafts <= self.tree.size

    def pick(self, num_rows: int, width: int, most_drafts: int, longest: int) -> TreeLoop | None:
        """DraftLoops.pick's answer for a tree: this loop when it holds the call (longer catch-ups are fed eagerly
        first), else None."""
        return self if self.fits(num_rows, width, most_drafts) else None

    @torch.inference_mode()
    def capture_all(self) -> None:
        self.graphs, self.outputs = capture_buckets(self._loop_fn, self.buckets, self.graph_cls, self.device)
        logger.info("tree draft loop: %d CUDA graphs (%d nodes) for up to %d sequences", len(self.buckets),
                    self.tree.size, self.buckets[-1])

    def run(self, batch: FlatBatch, last: Sequence[int], base: Sequence[int], limit: Sequence[int],
            keys: DraftKeys | None = None) -> torch.Tensor:
        """Drafts [n, size] on the device (a copy) of the catch-up `batch`; per row the flat index of its last token,
        its base and its number of drafts; `keys` as DraftLoop.run's (k = the tree's depth)."""
        n = batch.num_seqs
        bucket = bucket_for(n, self.buckets)
        self.buffers.fill(batch, bucket)
        rows = np.zeros((self.rows.shape[0], bucket), dtype=np.int64)
        rows[0, :n], rows[0, n:] = last, len(batch.input_ids) + np.arange(bucket - n)  # padding: its one slot
        fed_end = 1 + 3 * self.num_fed
        rows[1:fed_end + len(self.fed), :n] = self._level_rows(np.asarray(batch.block_tables), np.asarray(base),
                                                              np.asarray(limit))
        rows[2:fed_end:3, n:], rows[3:fed_end:3, n:], rows[fed_end:fed_end + len(self.fed), n:] = -1, 1, 1
        params = DraftKeys.argmax_params(bucket)  # padding rows: position 0, no slot, key 0; the argmax
        if keys is not None and self.sampled:
            rows[fed_end + len(self.fed):, :n] = keys.keys
            params[:, :n] = keys.params
        self.rows[:, :bucket].copy_(torch.from_numpy(rows), non_blocking=True)
        self.params[:, :bucket].copy_(torch.from_numpy(params), non_blocking=True)
        self.graphs[bucket].replay()
        return self.outputs[bucket][:n].clone()

    def _level_rows(self, table: np.ndarray, base: np.ndarray, limit: np.ndarray) -> np.ndarray:
        """[3 * fed nodes + levels, n]: pos, slot, ctx of each fed node (level order), then each level's seq len."""
        out = []
        for d, fed in enumerate(self.fed, start=1):
            for node in fed:
                # a node whose children are all past the row's limit may be past its blocks too: no slot
                key, kept = base + 1 + node, node + 1 < limit
                block = table[np.arange(len(base)), np.where(kept, key // self.block_size, 0)].astype(np.int64)
                out += [base + d, np.where(kept, block * self.block_size + key % self.block_size, -1), base + 1]
        out += [base + 2 + max(fed) for fed in self.fed]
        return np.stack(out) if out else np.zeros((0, len(base)), dtype=np.int64)

    def _loop_fn(self, bucket: int) -> Callable[[], torch.Tensor]:
        tree, buffers, q = self.tree, self.buffers, self.query_len
        catch_up = buffers.metadata(bucket, self.max_model_len)
        ids, positions = buffers.input_ids[:bucket * q], buffers.positions[:bucket * q]
        last, table, params = self.rows[0, :bucket], buffers.block_tables[:bucket], list(self.params[:, :bucket])
        fed_end = 1 + 3 * self.num_fed
        seq_lens = self.rows[fed_end:fed_end + len(self.fed), :bucket]
        keys = self.rows[fed_end + len(self.fed):, :bucket]
        kids = {p: torch.tensor(tree.children(p, tree.size), device=self.device) for p in [-1, *sum(self.fed, [])]}
        levels, start = [], 1
        for d, fed in enumerate(self.fed):
            width = len(fed)
            # the level's rows [3, width, bucket] (static views); flat token t = row * width + node's place
            node_rows = self.rows[start:start + 3 * width, :bucket].view(width, 3, bucket)
            bits = torch.tensor([tree.ancestor_bits(i) for i in fed], device=self.device).repeat(bucket)
            starts = torch.arange(0, bucket * width + 1, width, dtype=torch.int32, device=self.device)
            levels.append((fed, torch.tensor(fed, device=self.device), node_rows, bits, starts, seq_lens[d]))
            start += 3 * width

        def choose(logits: torch.Tensor, parents: Sequence[int], drafts: torch.Tensor) -> None:
            per_parent = logits.view(bucket, len(parents), -1)
            for j, parent in enumerate(parents):  # index tensors made before the capture: no copies in the graph
                depth, scores, count = 0 if parent < 0 else tree.depths[parent], per_parent[:, j], len(kids[parent])
                drafts[:, kids[parent]] = (ranked(scores, params, keys[depth], count, self.kernels) if self.sampled
                                           else scores.topk(count, dim=-1).indices)

        def loop() -> torch.Tensor:
            drafts = torch.zeros(bucket, tree.size, dtype=torch.int64, device=self.device)
            with set_attention_metadata(catch_up):
                logits, _ = self.net.catch_up(ids, positions, last)
            choose(logits, [-1], drafts)
            for fed, fed_index, node_rows, bits, starts, lens in levels:
                # copies made at every replay (contiguous: the rotary kernel wants unit-stride positions)
                pos, slots, ctx = node_rows.permute(1, 2, 0).reshape(3, -1).contiguous()
                metadata = AttentionMetadata(
                    slot_mapping=slots, query_start_loc=starts, seq_lens=lens.to(torch.int32), block_tables=table,
                    max_query_len=len(fed), max_seq_len=self.max_model_len, query_start_loc_cpu=[],
                    seq_lens_cpu=[self.max_model_len] * bucket, tree_mask=TreeMask(ctx, bits, [], []))
                with set_attention_metadata(metadata):
                    logits, _ = self.net.step(drafts.index_select(1, fed_index).reshape(-1), pos, None)
                choose(logits, fed, drafts)
            return drafts
        return loop
