"""EagleProposer: the EAGLE-3 head (lamina/spec/eagle_head.py) drafts from the target's own features.

The target hands the features f[p] (its residual stream entering 3 of its layers) of every position it computes
to the proposer (CausalLM.record_aux_hidden_states' sink), which keeps fc(f[p]) at the token's KV slot: one
matmul and one scatter inside the target's forward (inside its CUDA graph: no host work), so the features
outlive the step in the blocks of the request, like its K/V. The head itself runs only when a request drafts: it
first catches up on the positions it has not seen since it last drafted for that request, reading their
features by slot. Head position p holds (token p + 1, fc(f[p])):

    one request, N = len(token_ids), the head has fed positions [0, fed) since it last drafted for it:
    position     0 ........ fed ........... N - 2 | N - 1      N       ...  N - 3 + k
    fed          (earlier)  | token p+1, fc(f[p]) | d0, y      d1, y    ...  d(k-2), y     y: the head's own
    forward                 |  catch-up (1 call)  | draft 1    draft 2  ...  draft k - 1   pre-norm output of
    logits at               N - 2 -> d0           | N-1 -> d1, ...,  N-3+k -> d(k-1)       the step before
    head KV written at [fed, N - 3 + k], inside [0, N - 1 + num_drafts): the request's blocks;  fed := N - 1

Every position below N - 1 was computed by the target with its verified token (a rejected draft's position is
computed again, and its slot's features rewritten, before the catch-up reaches it), so the catch-up reads the
features a continuously fed head would have seen, and drafts the same tokens. The positions of drafts (N - 1 and
on) are fed again by the next catch-up. A request that does not draft costs the head nothing but the store:
while the policy keeps drafting off, the head does not run. `forget` drops a request's `fed` (finished, or
preempted: its blocks may change), so it starts again from position 0; a prefix-cache hit reads the features
stored when the shared blocks were computed. Drafts are greedy (one-hot proposals, exact under the verify step's
rule); they never decide the output. They are not sampled as a draft model's are (lamina/spec/draft_sampling.py):
the head learns the target's greedy tokens, so its distribution says where the target's argmax lies, not p_T;
drawn from it with the verify rows' noise, the demo head's first drafts at T = 0.6 were accepted less often than
its argmax (0.592 / 0.427 / 0.486 against 0.607 / 0.458 / 0.465 on code / chat / prose). With CUDA graphs
(compile_and_capture) a call is one replay: the catch-up and the k - 1 steps in one graph
(lamina/spec/eagle_loop.py), a wide loop for catch-ups of more than k + 1 tokens a row (lamina/spec/draft_loop.py:
DraftLoops); a catch-up longer than even that loop's rows is fed eagerly first.

Tree drafts (`tree`, lamina/spec/draft_tree.py; eagerly, like a static EAGLE tree): after the catch-up, level d
feeds every node of depth d that has children, (its draft, its parent's y) at head position N - 2 + d in the slot
of N - 1 + i, seeing head positions [0, N - 1) and its ancestors (TreeMask rows); a node's c children are the top c
of its logits. Draft positions are fed again by the next catch-up, as a chain's are.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import numpy as np
import torch
from safetensors.torch import load_file

from lamina.attention.backends import get_attention_backend
from lamina.attention.metadata import AttentionMetadata, TreeMask, get_attention_metadata, set_attention_metadata
from lamina.config import KernelChoice
from lamina.device import packed_to_device
from lamina.kv.cache import KVCache, allocate_kv_caches, bind_kv_caches, kv_cache_bytes_per_block
from lamina.layers.dispatch import DEFAULT_KERNELS
from lamina.models.common import CausalLM
from lamina.models.names import format_names
from lamina.spec.eagle_head import FIELD, WEIGHTS, EagleHead, read_head_config
from lamina.spec.draft_loop import DraftLoop, block_table, slot_mapping, stack_columns
from lamina.spec.eagle_loop import CatchUpRow, EagleLoops, catch_up_batch
from lamina.spec.draft_tree import DraftTree
from lamina.spec.model_proposer import DraftRequest, Drafts

__all__ = ["EagleProposer", "load_head"]


def load_head(model_dir: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
              attention_backend: str = "auto", kernels: KernelChoice = DEFAULT_KERNELS) -> tuple[EagleHead, dict]:
    """The head of a head directory with its weights, loaded strictly (every tensor, nothing else); `kernels`: the
    target's KernelChoice."""
    cfg, raw = read_head_config(model_dir)
    head = EagleHead(cfg, get_attention_backend(attention_backend, pdl=kernels.pdl), kernels)
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


def feature_store(features: torch.Tensor, fc: torch.nn.Module, dtype: torch.dtype) -> Callable[[torch.Tensor], None]:
    """The target's aux sink (CausalLM.record_aux_hidden_states): keep fc(f) of the forward's tokens (aux [T, 3H])
    at their KV slots in `features` (one row per KV slot, then a spare row). It runs inside the forward, so inside
    its CUDA graph: no host work a step, two kernels (the fc and one scatter). A token that stores no KV (slot -1:
    graph padding) writes into the spare last row (a negative index counts from the end). It holds the tensor and
    the layer, not the proposer: the target keeps it, and a reference cycle would outlive a dropped engine."""
    def store(aux: torch.Tensor) -> None:
        features.index_put_((get_attention_metadata().slot_mapping,), fc(aux.to(dtype)))
    return store


class EagleProposer:
    """The ModelProposer of `speculative_config.method == "eagle"` (module docstring). ValueError naming
    speculative_config.model when the head was trained for another target."""

    uses_hidden = False  # propose does not read `hidden`

    def __init__(self, model_dir: str, target: CausalLM, dtype: torch.dtype, device: torch.device | str,
                 attention_backend: str = "auto", tree: DraftTree | None = None) -> None:
        cfg, raw = read_head_config(model_dir)
        arch = target.arch
        for key, theirs in (("hidden_size", arch.hidden_size), ("vocab_size", arch.vocab_size)):
            if raw[key] != theirs:
                raise ValueError(f"{FIELD}: the EAGLE head in {model_dir!r} has {key} {raw[key]}, the target "
                                 f"model has {theirs}; a head only fits the model it was trained on")
        if max(cfg.aux_hidden_state_layers) >= arch.num_hidden_layers:
            raise ValueError(f"{FIELD}: the EAGLE head in {model_dir!r} reads layers {cfg.aux_hidden_state_layers}"
                             f" (aux_hidden_state_layers), the target has {arch.num_hidden_layers} layers")
        self.head, _ = load_head(model_dir, device, dtype, attention_backend, target.kernels)
        self.cfg = cfg
        self.target = target
        self.device = torch.device(device)
        self.dtype = dtype
        self.kv_arch = dataclasses.replace(arch, num_hidden_layers=1, num_attention_heads=cfg.num_attention_heads,
                                           num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim)
        self.block_size = 0  # set by bind_cache
        self.kv_caches: list[KVCache] = []
        self.features = torch.empty(0, cfg.hidden_size, dtype=dtype, device=self.device)  # [slots + 1, H], bind_cache
        self._fed: dict[str, int] = {}  # req id -> head positions [0, fed) hold verified tokens
        self.loops: EagleLoops | None = None  # set by compile_and_capture
        self.tree = tree

    def kv_bytes_per_block(self, block_size: int) -> int:
        """The head's K/V and the stored features of one block's tokens."""
        feature_bytes = block_size * self.cfg.hidden_size * self.features.element_size()
        return kv_cache_bytes_per_block(self.kv_arch, block_size, self.dtype) + feature_bytes

    def bind_cache(self, num_blocks: int, block_size: int) -> None:
        self.kv_caches = allocate_kv_caches(self.kv_arch, num_blocks, block_size, self.dtype, self.device)
        bind_kv_caches(self.head, self.kv_caches)
        self.features = torch.zeros(num_blocks * block_size + 1, self.cfg.hidden_size, dtype=self.dtype,
                                    device=self.device)  # the last row: graph padding's (feature_store)
        self.target.record_aux_hidden_states(self.cfg.aux_hidden_state_layers,
                                             sink=feature_store(self.features, self.head.fc, self.dtype))
        self.block_size = block_size

    def compile_and_capture(self, max_batch_size: int, max_model_len: int, num_drafts: int,
                            warm_up: Callable[[torch.nn.Module], None] | None, graph_cls: type | None = None) -> None:
        """With graphs (max_batch_size > 0) capture the call (lamina/spec/eagle_loop.py); else it runs eagerly:
        one catch-up forward and k - 1 one-token steps."""
        if max_batch_size == 0 or self.tree is not None:  # trees: eagerly
            return
        kwargs = {} if graph_cls is None else {"graph_cls": graph_cls}
        max_len = min(max_model_len, self.cfg.max_position_embeddings)
        self.loops = EagleLoops(self.head, self.target, self.features, num_drafts, max_batch_size, max_len,
                                self.block_size, self.device, **kwargs)
        self.loops.capture_all()

    def forget(self, req_ids: Iterable[str]) -> None:
        for req_id in req_ids:
            self._fed.pop(req_id, None)

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest], hidden: torch.Tensor) -> Drafts:
        """Up to num_drafts tokens for each request, after catching the head up on its unseen positions (`hidden`,
        the target's last hidden states, is not used: the head reads the stored features)."""
        if not self.block_size:
            raise RuntimeError("EagleProposer.propose called before bind_cache")
        rows = self._plan(requests)
        if not rows:
            return Drafts.empty(len(requests), self.device)
        if self.tree is not None:
            token_ids = self._propose_tree(rows)
        elif (loop := self._graph_loop(rows)) is not None:
            token_ids = self._propose_in_graph(rows, loop)
        else:
            rows = sorted(rows, key=lambda r: -r.limit)  # the rows of eager step j are a prefix
            token_ids = self._propose_eagerly(rows)
        for row in rows:
            self._fed[row.req_id] = len(row.token_ids) - 1
        return Drafts.of_rows(token_ids, len(requests), [r.index for r in rows], [r.limit for r in rows])

    def _plan(self, requests: list[DraftRequest]) -> list[CatchUpRow]:
        """A catch-up row per request that drafts: head positions [fed, N - 1), at least the base N - 2."""
        rows = []
        for index, request in enumerate(requests):
            n = len(request.token_ids)
            limit = min(request.num_drafts, self.cfg.max_position_embeddings - n + 2)
            if n < 2 or limit < 1:
                continue
            if len(request.block_ids) * self.block_size < n - 1 + limit:
                raise ValueError(f"block_ids of request {request.req_id!r}: {len(request.block_ids)} block(s) of "
                                 f"{self.block_size} do not cover positions [0, {n - 1 + limit})")
            start = min(self._fed.get(request.req_id, 0), n - 2)
            rows.append(CatchUpRow(request.req_id, request.token_ids, request.block_ids, start, n - 1 - start,
                                   limit, index))
        return rows

    def _graph_loop(self, rows: list[CatchUpRow]) -> DraftLoop | None:
        if self.loops is None:
            return None
        return self.loops.pick(len(rows), max(len(r.block_ids) for r in rows), max(r.count for r in rows))

    def _propose_in_graph(self, rows: list[CatchUpRow], loop: DraftLoop) -> torch.Tensor:
        """Rows longer than the loop's query_len feed all but their base eagerly first; then one replay for every
        row: drafts [len(rows), k], row by row."""
        q = loop.query_len
        long = [r for r in rows if r.count > q]
        if long:
            self._catch_up([dataclasses.replace(r, count=r.count - 1) for r in long])
            rows = [dataclasses.replace(r, start=r.base, count=1) if r.count > q else r for r in rows]
        return self.loops.run(rows, loop)

    def _propose_eagerly(self, rows: list[CatchUpRow]) -> torch.Tensor:
        """One catch-up forward over every row, then k - 1 one-token steps of the rows that want more (`rows`
        sorted by limit, largest first: the rows of step j are a prefix): drafts [len(rows), max limit]."""
        normed, y = self._catch_up(rows)
        (last,) = packed_to_device([np.cumsum([r.count for r in rows]) - 1], np.int64, self.device)
        token = self.target.compute_logits(normed.index_select(0, last)).argmax(dim=-1)
        y, columns = y.index_select(0, last), [token]
        for j in range(1, rows[0].limit):
            count = sum(r.limit > j for r in rows)
            token, y = self._step(rows[:count], j, token[:count], y[:count])
            columns.append(token)
        return stack_columns(columns)

    def _propose_tree(self, rows: list[CatchUpRow]) -> torch.Tensor:
        """Each row's first `limit` nodes of the tree (module docstring): drafts [len(rows), max limit]."""
        tree, limits = self.tree, [r.limit for r in rows]
        normed, y = self._catch_up(rows)
        (last,) = packed_to_device([np.cumsum([r.count for r in rows]) - 1], np.int64, self.device)
        logits, carry = self.target.compute_logits(normed.index_select(0, last)), y.index_select(0, last)
        drafts = torch.zeros((len(rows), max(limits)), dtype=torch.int64, device=self.device)
        parents = [(i, -1) for i in range(len(rows))]  # (row, node) of each row of `logits` / `carry`
        while True:
            kids, fed = tree.expand(parents, limits)
            top = logits.topk(max(map(len, kids)), dim=-1).indices
            for r, ((i, _), k) in enumerate(zip(parents, kids)):
                drafts[i, k] = top[r, :len(k)]
            if not fed:
                return drafts
            logits, carry = self._tree_level(rows, fed, drafts, carry)
            parents = [(i, c) for _, i, c in fed]

    def _tree_level(self, rows: list[CatchUpRow], fed: list[tuple[int, int, int]], drafts: torch.Tensor,
                    carry: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed the tree nodes `fed` [(parent's row of `carry`, row, node)], grouped by row: (logits, y) of each
        (roots at the rows' bases)."""
        level = self.tree.level([(i, c) for _, i, c in fed], [r.base for r in rows])
        table = block_table([rows[i].block_ids for i in level.rows])
        slots = slot_mapping(table, level.row_of, level.slot_positions, self.block_size)
        pos_dev, slot_dev, parent = packed_to_device([level.positions, slots, np.array([j for j, _, _ in fed])],
                                                     np.int64, self.device)
        normed, y = self._forward(drafts[[i for _, i, _ in fed], [c for _, _, c in fed]], carry.index_select(0, parent),
                                  pos_dev, slot_dev, level.query_start, level.seq_lens, table,
                                  TreeMask.of(level.ctx, level.bits, self.device))
        return self.target.compute_logits(normed), y

    def _catch_up(self, rows: list[CatchUpRow]) -> tuple[torch.Tensor, torch.Tensor]:
        """One flat forward over head positions [start, start + count) of every row: (normed, y) [sum(count), H]."""
        batch, _ = catch_up_batch(rows, self.block_size)
        ids, positions, slots = packed_to_device([batch.input_ids, batch.positions, batch.slot_mapping], np.int64,
                                                 self.device)
        return self._forward(ids, self.features.index_select(0, slots), positions, slots, batch.query_start_loc,
                             batch.seq_lens, batch.block_tables)

    def _step(self, rows: list[CatchUpRow], j: int, token: torch.Tensor, y: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft step j: feed (draft j - 1, y) at position base + j of each row; (draft j, new y)."""
        positions = np.array([r.base + j for r in rows], dtype=np.int64)
        table = block_table([r.block_ids for r in rows])
        slots = slot_mapping(table, np.arange(len(rows)), positions, self.block_size)
        pos_dev, slot_dev = packed_to_device([positions, slots], np.int64, self.device)
        normed, y = self._forward(token, y, pos_dev, slot_dev, np.arange(len(rows) + 1), positions + 1, table)
        return self.target.compute_logits(normed).argmax(dim=-1), y

    def _forward(self, ids: torch.Tensor, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                 query_start: np.ndarray, seq_lens: np.ndarray, table: np.ndarray,
                 tree_mask: TreeMask | None = None) -> tuple[torch.Tensor, ...]:
        starts, lens, table_dev = packed_to_device([query_start.astype(np.int32), seq_lens.astype(np.int32),
                                                    table.ravel()], np.int32, self.device)
        metadata = AttentionMetadata(
            slot_mapping=slots, query_start_loc=starts, seq_lens=lens, block_tables=table_dev.view(table.shape),
            max_query_len=int(np.diff(query_start).max()), max_seq_len=int(seq_lens.max()),
            query_start_loc_cpu=query_start.tolist(), seq_lens_cpu=seq_lens.tolist(), tree_mask=tree_mask)
        with set_attention_metadata(metadata):
            return self.head(self.target.model.embed_tokens(ids), x, positions)
