"""EagleProposer: the EAGLE-3 head (lamina/spec/eagle_head.py) drafts from the target's own features.

The target records the features f[p] (its residual stream entering 3 of its layers) of every position it
computes (CausalLM.record_aux_hidden_states); after each step the worker feeds the head every position the step
computed whose next token is now verified, and the head keeps its own one-layer paged KV cache, indexed by the
target's block ids like a draft model's (lamina/spec/draft_model.py). Head position p holds (token p + 1, f[p]):

    one request after step t, N = len(token_ids), the step computed target positions [c, c + q):
    position     0 ........ c ............ N - 2 | N - 1      N       ...  N - 3 + k
    fed          (earlier)  | token p+1, fc(f[p]) | d0, y      d1, y    ...  d(k-2), y     y: the head's own
    forward                 |  catch-up (1 call)  | draft 1    draft 2  ...  draft k - 1   pre-norm output of
    logits at               N - 2 -> d0           | N-1 -> d1, ...,  N-3+k -> d(k-1)       the step before
    head KV written at [c, N - 3 + k], inside [0, N - 1 + num_drafts): the request's blocks

The catch-up covers [c, min(c + q, N - 1)): a prompt chunk that samples nothing is fed too (its next tokens are
prompt tokens), the positions of rejected drafts are not (the target recomputes them, and the head is fed
them then). So every verified position is fed exactly when the target computes it, and nothing is kept per
request: the draft positions' KV is overwritten by the next catch-up, a preempted request is fed again as it is
recomputed, and a prefix-cache hit finds the head's KV in the same blocks, written when they were computed.
Drafts are greedy (one-hot proposals, exact under the verify step's rule); they never decide the output.
With CUDA graphs (compile_and_capture) a call is one replay: the catch-up and the k - 1 steps in one graph, or the
catch-up alone when nobody drafts (lamina/spec/eagle_loop.py).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from safetensors.torch import load_file

from lamina.attention.backends import get_attention_backend
from lamina.attention.metadata import AttentionMetadata, set_attention_metadata
from lamina.device import packed_to_device
from lamina.kv.cache import KVCache, allocate_kv_caches, bind_kv_caches, kv_cache_bytes_per_block
from lamina.models.common import CausalLM
from lamina.models.names import format_names
from lamina.spec.eagle_head import FIELD, WEIGHTS, EagleHead, read_head_config
from lamina.spec.draft_loop import block_table, slot_mapping
from lamina.spec.eagle_loop import EagleLoops, GraphRow
from lamina.spec.model_proposer import DraftRequest

__all__ = ["EagleProposer", "Feed", "load_head"]


@dataclass(slots=True)
class Feed:
    """One request's positions [start, start + count) computed by the step, whose features are rows
    [row, row + count) of the step's features; token_ids: its verified tokens after the step."""

    req_id: str
    token_ids: Sequence[int]
    block_ids: list[int]
    start: int
    count: int
    row: int


def load_head(model_dir: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
              attention_backend: str = "auto") -> tuple[EagleHead, dict]:
    """The head of a head directory with its weights, loaded strictly (every tensor, nothing else)."""
    cfg, raw = read_head_config(model_dir)
    head = EagleHead(cfg, get_attention_backend(attention_backend))
    tensors = load_file(f"{model_dir}/{WEIGHTS}")
    expected = head.state_dict()
    unexpected, missing = sorted(set(tensors) - set(expected)), sorted(set(expected) - set(tensors))
    if unexpected or missing:
        raise ValueError(f"{FIELD}: {model_dir}/{WEIGHTS} does not match its config: unexpected "
                         f"{format_names(unexpected)}, missing {format_names(missing)}")
    for name, tensor in tensors.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(f"{FIELD}: tensor {name!r} has shape {tuple(tensor.shape)}, expected "
                             f"{tuple(expected[name].shape)}")
    head.load_state_dict(tensors)
    return head.to(device=device, dtype=dtype).eval().requires_grad_(False), raw


class EagleProposer:
    """The ModelProposer of `speculative_config.method == "eagle"`; the worker calls `propose_fed` (module
    docstring). ValueError naming speculative_config.model when the head was trained for another target."""

    def __init__(self, model_dir: str, target: CausalLM, dtype: torch.dtype, device: torch.device | str,
                 attention_backend: str = "auto") -> None:
        cfg, raw = read_head_config(model_dir)
        arch = target.arch
        for key, theirs in (("hidden_size", arch.hidden_size), ("vocab_size", arch.vocab_size)):
            if raw[key] != theirs:
                raise ValueError(f"{FIELD}: the EAGLE head in {model_dir!r} has {key} {raw[key]}, the target "
                                 f"model has {theirs}; a head only fits the model it was trained on")
        if max(cfg.aux_hidden_state_layers) >= arch.num_hidden_layers:
            raise ValueError(f"{FIELD}: the EAGLE head in {model_dir!r} reads layers {cfg.aux_hidden_state_layers}"
                             f" (aux_hidden_state_layers), the target has {arch.num_hidden_layers} layers")
        self.head, _ = load_head(model_dir, device, dtype, attention_backend)
        self.cfg = cfg
        self.target = target
        self.device = torch.device(device)
        self.dtype = dtype
        self.kv_arch = dataclasses.replace(arch, num_hidden_layers=1, num_attention_heads=cfg.num_attention_heads,
                                           num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim)
        self.block_size = 0  # set by bind_cache
        self.kv_caches: list[KVCache] = []
        self.loops: EagleLoops | None = None  # set by compile_and_capture
        target.record_aux_hidden_states(cfg.aux_hidden_state_layers)

    def kv_bytes_per_block(self, block_size: int) -> int:
        return kv_cache_bytes_per_block(self.kv_arch, block_size, self.dtype)

    def bind_cache(self, num_blocks: int, block_size: int) -> None:
        self.kv_caches = allocate_kv_caches(self.kv_arch, num_blocks, block_size, self.dtype, self.device)
        bind_kv_caches(self.head, self.kv_caches)
        self.block_size = block_size

    def compile_and_capture(self, max_batch_size: int, max_model_len: int, num_drafts: int,
                            warm_up: Callable[[torch.nn.Module], None] | None, graph_cls: type | None = None) -> None:
        """With graphs (max_batch_size > 0) capture the call (lamina/spec/eagle_loop.py); else it runs eagerly:
        one catch-up forward and k - 1 one-token steps."""
        if max_batch_size == 0:
            return
        kwargs = {} if graph_cls is None else {"graph_cls": graph_cls}
        max_len = min(max_model_len, self.cfg.max_position_embeddings)
        self.loops = EagleLoops(self.head, self.target, num_drafts, max_batch_size, max_len, self.block_size,
                                self.dtype, self.device, **kwargs)
        self.loops.capture_all()

    def forget(self, req_ids: Iterable[str]) -> None:
        """Nothing is kept per request (module docstring)."""

    def propose(self, requests: list[DraftRequest], hidden: torch.Tensor) -> list[list[int]]:
        """Without the step's features the head cannot draft (the worker calls `propose_fed`)."""
        return [[] for _ in requests]

    @torch.inference_mode()
    def propose_fed(self, feeds: list[Feed], requests: list[DraftRequest], features: torch.Tensor
                    ) -> list[list[int]]:
        """Feed the head every position of `feeds` (features [T, 3H]: the step's rows), then draft up to
        num_drafts tokens for each of `requests` whose feed ends at its position N - 2 (the others get none)."""
        if not self.block_size:
            raise RuntimeError("EagleProposer.propose_fed called before bind_cache")
        drafts: list[list[int]] = [[] for _ in requests]
        if not feeds:
            return drafts
        limits = self._limits(requests, feeds)
        plan = self._graph_plan(feeds, limits) if self.loops is not None else None
        if plan is not None:
            return self._propose_in_graph(*plan, features, drafts)
        return self._propose_eagerly(feeds, requests, limits, features, drafts)

    def _propose_eagerly(self, feeds: list[Feed], requests: list[DraftRequest], limits: dict[str, tuple[int, int]],
                         features: torch.Tensor, drafts: list[list[int]]) -> list[list[int]]:
        """One catch-up forward over every feed, then k - 1 one-token steps of the drafting requests."""
        normed, y = self._catch_up(feeds, features)
        ends, offset = {}, 0
        for feed in feeds:
            offset += feed.count
            ends[feed.req_id] = offset - 1
        rows = sorted(((i, limit) for i, limit in limits.values()), key=lambda r: -r[1])
        if not rows:
            return drafts
        last = torch.tensor([ends[requests[i].req_id] for i, _ in rows], dtype=torch.int64, device=self.device)
        token = self.target.compute_logits(normed.index_select(0, last)).argmax(dim=-1)
        y, columns = y.index_select(0, last), [token]
        for j in range(1, rows[0][1]):
            count = sum(limit > j for _, limit in rows)
            token, y = self._step([requests[i] for i, _ in rows[:count]], j, token[:count], y[:count])
            columns.append(token)
        flat = torch.cat(columns).tolist()  # the one host read
        offset = 0
        for column in columns:
            for (index, _), t in zip(rows, flat[offset:offset + len(column)]):
                drafts[index].append(t)
            offset += len(column)
        return drafts

    def _limits(self, requests: list[DraftRequest], feeds: list[Feed]) -> dict[str, tuple[int, int]]:
        """req id -> (index, drafts) of the requests that draft: their feed ends at position N - 2."""
        ends = {f.req_id for f in feeds if f.start + f.count == len(f.token_ids) - 1}
        limits = {}
        for index, request in enumerate(requests):
            n = len(request.token_ids)
            limit = min(request.num_drafts, self.cfg.max_position_embeddings - n + 2)
            if request.req_id not in ends or limit < 1:
                continue
            if len(request.block_ids) * self.block_size < n - 1 + limit:
                raise ValueError(f"block_ids of request {request.req_id!r}: {len(request.block_ids)} block(s) of "
                                 f"{self.block_size} do not cover positions [0, {n - 1 + limit})")
            limits[request.req_id] = (index, limit)
        return limits

    def _graph_plan(self, feeds: list[Feed], limits: dict[str, tuple[int, int]]
                    ) -> tuple[list[GraphRow], list[Feed]] | None:
        """(the loop's rows, the feeds fed eagerly first), or None when the rows do not fit the captured graphs (the
        call then runs eagerly). A feed longer than q is fed eagerly: all of it, or all but its last position when
        it drafts (that one stays a row)."""
        rows, eager = [], []
        for f in feeds:
            index, limit = limits.get(f.req_id, (-1, 0))
            if f.count <= self.loops.q:
                rows.append(GraphRow(f.token_ids, f.block_ids, f.start, f.count, f.row, limit, index))
            elif limit:
                eager.append(dataclasses.replace(f, count=f.count - 1))
                rows.append(GraphRow(f.token_ids, f.block_ids, f.start + f.count - 1, 1, f.row + f.count - 1, limit,
                                     index))
            else:
                eager.append(f)
        width = max(len(f.block_ids) for f in feeds)
        return (rows, eager) if self.loops.fits(len(rows), width) else None

    def _propose_in_graph(self, rows: list[GraphRow], eager: list[Feed], features: torch.Tensor,
                          drafts: list[list[int]]) -> list[list[int]]:
        """Feed `eager` eagerly, then one replay for every row."""
        if eager:
            self._catch_up(eager, features)
        if not rows:
            return drafts
        for row, tokens in zip(rows, self.loops.run(rows, features)):
            if row.limit:
                drafts[row.index] = tokens
        return drafts

    def _catch_up(self, feeds: list[Feed], features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One flat forward over every feed's positions: (normed, y) [sum(count), H]."""
        ids = np.concatenate([np.asarray(f.token_ids[f.start + 1:f.start + 1 + f.count], dtype=np.int64)
                              for f in feeds])
        rows = np.concatenate([np.arange(f.row, f.row + f.count) for f in feeds])
        positions = np.concatenate([np.arange(f.start, f.start + f.count) for f in feeds])
        row_of = np.repeat(np.arange(len(feeds)), [f.count for f in feeds])
        query_start = np.concatenate(([0], np.cumsum([f.count for f in feeds])))
        seq_lens = np.array([f.start + f.count for f in feeds], dtype=np.int64)
        table = block_table([f.block_ids for f in feeds])
        ids_dev, pos_dev, rows_dev = packed_to_device([ids, positions, rows], np.int64, self.device)
        x = self.head.fc(features.index_select(0, rows_dev).to(self.dtype))
        return self._forward(ids_dev, x, pos_dev, self._slots(table, row_of, positions), query_start, seq_lens,
                             table)

    def _step(self, requests: list[DraftRequest], j: int, token: torch.Tensor, y: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft step j: feed (draft j - 1, y) at position N - 2 + j of each request; (draft j, new y)."""
        positions = np.array([len(r.token_ids) - 2 + j for r in requests], dtype=np.int64)
        table = block_table([r.block_ids for r in requests])
        slots = self._slots(table, np.arange(len(requests)), positions)
        (pos_dev,) = packed_to_device([positions], np.int64, self.device)
        normed, y = self._forward(token, y, pos_dev, slots, np.arange(len(requests) + 1), positions + 1, table)
        return self.target.compute_logits(normed).argmax(dim=-1), y

    def _forward(self, ids: torch.Tensor, x: torch.Tensor, positions: torch.Tensor, slots: np.ndarray,
                 query_start: np.ndarray, seq_lens: np.ndarray, table: np.ndarray) -> tuple[torch.Tensor, ...]:
        slot_dev, = packed_to_device([slots], np.int64, self.device)
        starts, lens, table_dev = packed_to_device([query_start.astype(np.int32), seq_lens.astype(np.int32),
                                                    table.ravel()], np.int32, self.device)
        metadata = AttentionMetadata(
            slot_mapping=slot_dev, query_start_loc=starts, seq_lens=lens, block_tables=table_dev.view(table.shape),
            max_query_len=int(np.diff(query_start).max()), max_seq_len=int(seq_lens.max()),
            query_start_loc_cpu=query_start.tolist(), seq_lens_cpu=seq_lens.tolist())
        with set_attention_metadata(metadata):
            return self.head(self.target.model.embed_tokens(ids), x, positions)

    def _slots(self, table: np.ndarray, row_of: np.ndarray, positions: np.ndarray) -> np.ndarray:
        return slot_mapping(table, row_of, positions, self.block_size)

