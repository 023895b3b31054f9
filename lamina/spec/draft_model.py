"""DraftModelProposer: a smaller checkpoint with the target's vocabulary drafts greedily (vLLM's "draft_model").

The draft model keeps its own paged KV cache, indexed by the target's block ids: block b of the draft
cache holds the draft's K/V of the tokens that block b of the target holds. Per request it remembers the
tokens it has fed (the KV it has written). One request, N = len(token_ids), k = the drafts it makes:

    position    0 ..... s ......... N-1 | N    N+1  ...  N+k-2 | N+k-1
    token       | kept  | stale/new |new| d0   d1   ...  d(k-2)| d(k-1)   (never fed)
    forward             |  catch-up     | dec 1 dec 2 ... dec k-1|
    logits at           N-1 -> d0       | N -> d1, ..., N+k-2 -> d(k-1)
    draft KV written at [s, N+k-1), a part of [0, N-1+num_drafts): inside the blocks the request was given

    s: the first position whose fed token is missing or differs from token_ids (a draft the target
       rejected), at most N-1; everything is fed on first sight (and after `forget`).

One propose call: the catch-up is one flat batch over every request (variable query lengths, like the
target's step); then decode step j (1 <= j < max k) feeds draft j-1 at position N-1+j of each request that
wants more than j drafts. Rows are sorted by k, largest first, so the requests of step j are a prefix of
the rows and the drafts stay on the device (the verify step reads them there; what the draft cache was fed is
read back later, `_Fed.drafts`). Drafts are the argmax, or samples drawn with the noise of the rows that verify
them (lamina/spec/draft_sampling.py); `hidden` is not used.

Tree drafts (`tree`, lamina/spec/draft_tree.py): after the catch-up, level d feeds every node of depth d that has
children, in one forward (node i in the slot of position N + i, at position N - 1 + d, seeing the context and its
ancestors), and a node's c children are its c best drafts (`ranked`: the chain's draft, then the argmax order);
with graphs, the whole call is one replay (lamina/spec/tree_loop.py). The main chain's fed nodes sit in the slots
of their positions, as a chain's drafts do; the cache is taken to hold those only.

Positions: the draft model has RoPE for max_position_embeddings = M positions. A request drafts at most
M - N + 1 tokens (its last fed position stays below M), none once N > M: a short-context draft model
drafts less, never fails (the protocol allows fewer drafts). A warning at load says when M is below the
target's.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch

from lamina.attention.metadata import AttentionMetadata, TreeMask, set_attention_metadata
from lamina.config import KernelChoice, ModelArch
from lamina.device import packed_to_device
from lamina.kv.cache import KVCache, allocate_kv_caches, bind_kv_caches, kv_cache_bytes_per_block
from lamina.layers.dispatch import DEFAULT_KERNELS
from lamina.loader.hf_config import load_model_arch
from lamina.loader.model_loader import load_model
from lamina.spec.draft_loop import (CatchUp, DraftLoop, DraftLoops, HostCopy, ModelNet, block_table, slot_mapping,
                                   stack_columns)
from lamina.spec.draft_sampling import DraftKeys, DraftPicker, ranked, sampling_kernels
from lamina.spec.draft_tree import DraftTree
from lamina.spec.model_proposer import DraftRequest, Drafts
from lamina.spec.tree_loop import TreeLoop

__all__ = ["DraftModelProposer"]

logger = logging.getLogger(__name__)

FIELD = "speculative_config.model"


@dataclass(slots=True)
class _Fed:
    """What the draft cache holds for one request: the token fed at each position [0, len(tokens)), then the
    drafts of the last call still on their way to the host (`drafts`: row r's first c drafts of a HostCopy)."""

    tokens: list[int]
    verified: int  # tokens[:verified] were verified tokens when fed: they never go stale
    drafts: tuple[HostCopy, int, int] | None = None

    def read(self) -> list[int]:
        """tokens, with the drafts appended once they are on the host."""
        if self.drafts is not None:
            copy, row, count = self.drafts
            self.tokens.extend(copy.tolist()[row][:count])
            self.drafts = None
        return self.tokens


@dataclass(slots=True)
class _Row:
    """One drafting request of a propose call."""

    index: int  # in the call's requests
    request: DraftRequest
    start: int  # s: the first position the catch-up feeds
    limit: int  # k: drafts it makes

    @property
    def n(self) -> int:
        return len(self.request.token_ids)


class DraftModelProposer:
    """Drafts from the checkpoint in `model_dir`, loaded in `dtype` on `device` with lamina's loader and
    the given attention backend (module docstring for positions and the KV it writes).

    ValueError (naming speculative_config.model) when the checkpoint does not load or its vocab_size differs
    from the target's.
    """

    uses_hidden = False  # propose does not read `hidden`

    def __init__(self, model_dir: str, target_arch: ModelArch, dtype: torch.dtype, device: torch.device | str,
                 attention_backend: str = "auto", kernels: KernelChoice = DEFAULT_KERNELS,
                 tree: DraftTree | None = None) -> None:
        try:
            arch = load_model_arch(model_dir)
        except ValueError as exc:
            raise ValueError(f"{FIELD} ({model_dir!r}): {exc}") from None
        if arch.vocab_size != target_arch.vocab_size:
            raise ValueError(f"{FIELD}: the draft model's vocab_size ({arch.vocab_size}) must equal the target's "
                             f"({target_arch.vocab_size}); a draft model shares the target's tokenizer")
        if arch.max_position_embeddings < target_arch.max_position_embeddings:
            logger.warning("%s: the draft model has %d positions, the target %d: requests past %d get no drafts",
                           FIELD, arch.max_position_embeddings, target_arch.max_position_embeddings,
                           arch.max_position_embeddings)
        self.arch = arch
        self.dtype = dtype
        self.device = torch.device(device)
        self.model = load_model(model_dir, arch, dtype, self.device, attention_backend=attention_backend,
                                kernels=kernels)
        self.block_size = 0  # set by bind_cache
        self.kv_caches: list[KVCache] = []
        self._fed: dict[str, _Fed] = {}
        self.tree = tree
        self.sampling_kernels = sampling_kernels(self.device)  # tree drafts' first children (draft_sampling.ranked)
        self.loop: DraftLoops | TreeLoop | None = None  # set by compile_and_capture
        self.eager_catch_up_tokens = 0  # fed eagerly before a replay: catch-ups longer than every loop takes

    def kv_bytes_per_block(self, block_size: int) -> int:
        return kv_cache_bytes_per_block(self.arch, block_size, self.dtype)

    def bind_cache(self, num_blocks: int, block_size: int) -> None:
        self.kv_caches = allocate_kv_caches(self.arch, num_blocks, block_size, self.dtype, self.device)
        bind_kv_caches(self.model, self.kv_caches)
        self.block_size = block_size

    def compile_and_capture(self, max_batch_size: int, max_model_len: int, num_drafts: int,
                            warm_up: Callable[[torch.nn.Module], None] | None, graph_cls: type | None = None) -> None:
        """Compile the draft's kernels (its eager forwards: prompts), then capture the propose call (catch-up +
        k - 1 decode steps, lamina/spec/draft_loop.py, wide catch-ups too; or a tree's levels, tree_loop.py) per
        batch bucket when max_batch_size > 0."""
        if warm_up is not None:  # within the draft's positions (RoPE tables end there)
            warm_up(self.model, max_model_len=min(max_model_len, self.arch.max_position_embeddings))
        if max_batch_size == 0:
            return
        kwargs = {} if graph_cls is None else {"graph_cls": graph_cls}
        max_len = min(max_model_len, self.arch.max_position_embeddings)
        net = ModelNet(self.model)
        self.loop = (DraftLoops(net, num_drafts, max_batch_size, max_len, self.block_size, self.device, **kwargs)
                     if self.tree is None else
                     TreeLoop(net, self.tree, max_batch_size, max_len, self.block_size, self.device, **kwargs))
        self.loop.capture_all()

    def forget(self, req_ids: Iterable[str]) -> None:
        for req_id in req_ids:
            self._fed.pop(req_id, None)

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest], hidden: torch.Tensor) -> Drafts:
        if not self.block_size:
            raise RuntimeError("DraftModelProposer.propose called before bind_cache")
        rows = self._plan(requests)
        if not rows:
            return Drafts.empty(len(requests), self.device)
        table = block_table([r.request.block_ids for r in rows])
        loop = None if self.loop is None else self.loop.pick(len(rows), table.shape[1], rows[0].limit,
                                                             max(r.n - r.start for r in rows))
        if loop is not None:
            token_ids = self._propose_in_graph(rows, table, loop)
        elif self.tree is not None:
            token_ids = self._propose_tree(rows, table)
        else:
            table_dev = torch.from_numpy(table).to(self.device, non_blocking=True)
            picker = DraftPicker(DraftKeys.of([r.request for r in rows], rows[0].limit), self.device)
            columns = [picker(self._catch_up(rows, table, table_dev), 0)]
            for j in range(1, rows[0].limit):
                count = sum(r.limit > j for r in rows)
                columns.append(picker(self._decode(rows[:count], j, columns[-1][:count], table, table_dev), j))
            token_ids = stack_columns(columns)
        fed = HostCopy(token_ids)
        for i, row in enumerate(rows):  # the drafts whose KV is in place: a chain's all but its last
            self._remember(row, fed, i, row.limit - 1 if self.tree is None else self.tree.fed_chain(row.limit))
        return Drafts.of_rows(token_ids, len(requests), [r.index for r in rows], [r.limit for r in rows])

    def _propose_in_graph(self, rows: list[_Row], table: np.ndarray, loop: DraftLoop | TreeLoop) -> torch.Tensor:
        """Rows whose catch-up is longer than the loop's rows first feed all but their newest token eagerly
        (a long prompt); then one replay drafts for every row: drafts [len(rows), k]."""
        long = [r for r in rows if r.n - r.start > loop.query_len]
        if long:
            self._prefill(long)
        starts = [0]
        for r in rows:
            starts.append(starts[-1] + r.n - r.start)
        positions = np.concatenate([np.arange(r.start, r.n) for r in rows])
        row_of = np.repeat(np.arange(len(rows)), [r.n - r.start for r in rows])
        batch = CatchUp(input_ids=[int(t) for r in rows for t in r.request.token_ids[r.start:r.n]],
                        positions=positions.tolist(), slot_mapping=self._slots(table, row_of, positions).tolist(),
                        query_start_loc=starts, seq_lens=[r.n for r in rows], block_tables=table.tolist())
        return loop.run(batch, [s - 1 for s in starts[1:]], [r.n - 1 for r in rows], [r.limit for r in rows],
                        DraftKeys.of([r.request for r in rows], loop.k))

    def _prefill(self, rows: list[_Row]) -> None:
        """Feed token_ids[s : N - 1] of each row eagerly (their KV); afterwards each row starts at N - 1."""
        lens = np.array([r.n - 1 - r.start for r in rows], dtype=np.int64)
        ids = np.concatenate([np.asarray(r.request.token_ids[r.start:r.n - 1], dtype=np.int64) for r in rows])
        row_of = np.repeat(np.arange(len(rows)), lens)
        query_start = np.concatenate(([0], np.cumsum(lens)))
        positions = np.array([r.start for r in rows])[row_of] + np.arange(len(ids)) - query_start[:-1][row_of]
        sub_table = block_table([r.request.block_ids for r in rows])
        table_dev = torch.from_numpy(sub_table).to(self.device, non_blocking=True)
        self._draft(ids, positions, self._slots(sub_table, row_of, positions), query_start,
                    np.array([r.n - 1 for r in rows], dtype=np.int64), table_dev)
        self.eager_catch_up_tokens += len(ids)
        for r in rows:
            fed = self._fed.setdefault(r.request.req_id, _Fed([], 0))
            del fed.tokens[r.start:]
            fed.tokens.extend(int(t) for t in r.request.token_ids[r.start:r.n - 1])
            r.start = r.n - 1

    def _plan(self, requests: list[DraftRequest]) -> list[_Row]:
        """The requests that draft, sorted by k (largest first), with their catch-up start."""
        rows = []
        for index, request in enumerate(requests):
            n = len(request.token_ids)
            limit = min(request.num_drafts, self.arch.max_position_embeddings - n + 1)
            if n == 0 or limit < 1:
                continue
            if len(request.block_ids) * self.block_size < n - 1 + limit:
                raise ValueError(f"block_ids of request {request.req_id!r}: {len(request.block_ids)} block(s) of "
                                 f"{self.block_size} do not cover positions [0, {n - 1 + limit})")
            rows.append(_Row(index, request, self._first_stale(request), limit))
        rows.sort(key=lambda r: -r.limit)
        return rows

    def _first_stale(self, request: DraftRequest) -> int:
        """s: the first position whose draft KV is missing or was fed a token other than token_ids' (<= N-1)."""
        tokens, n = request.token_ids, len(request.token_ids)
        fed = self._fed.get(request.req_id)
        if fed is None:
            return 0
        fed_tokens = fed.read()
        pos, end = min(fed.verified, n), min(len(fed_tokens), n)
        while pos < end and fed_tokens[pos] == tokens[pos]:
            pos += 1
        return min(pos, n - 1)

    def _remember(self, row: _Row, drafts: HostCopy, index: int, fed_drafts: int) -> None:
        """The draft cache now holds token_ids[:N] and the first `fed_drafts` drafts at N, N + 1, ... (row `index`
        of `drafts`, read when the next call needs them)."""
        request, n = row.request, row.n
        fed = self._fed.setdefault(request.req_id, _Fed([], 0))
        tokens = fed.read()
        del tokens[row.start:]
        tokens.extend(int(t) for t in request.token_ids[row.start:n])
        fed.verified = n
        fed.drafts = (drafts, index, fed_drafts)

    def _catch_up(self, rows: list[_Row], table: np.ndarray, table_dev: torch.Tensor) -> torch.Tensor:
        """One flat forward over token_ids[s:N] of every row; returns the logits of draft 0 of each row."""
        starts = np.array([r.start for r in rows], dtype=np.int64)
        ends = np.array([r.n for r in rows], dtype=np.int64)
        lens = ends - starts
        ids = np.concatenate([np.asarray(r.request.token_ids[r.start:r.n], dtype=np.int64) for r in rows])
        row_of = np.repeat(np.arange(len(rows)), lens)
        query_start = np.concatenate(([0], np.cumsum(lens)))
        positions = starts[row_of] + np.arange(len(ids)) - query_start[:-1][row_of]
        return self._draft(ids, positions, self._slots(table, row_of, positions), query_start, ends, table_dev)

    def _decode(self, rows: list[_Row], j: int, previous: torch.Tensor, table: np.ndarray,
                table_dev: torch.Tensor) -> torch.Tensor:
        """Feed draft j-1 at position N-1+j of each row; returns the logits of draft j of each row."""
        positions = np.array([r.n - 1 + j for r in rows], dtype=np.int64)
        query_start = np.arange(len(rows) + 1, dtype=np.int64)
        slots = self._slots(table, np.arange(len(rows)), positions)
        return self._draft(previous, positions, slots, query_start, positions + 1, table_dev[:len(rows)])

    def _slots(self, table: np.ndarray, row_of: np.ndarray, positions: np.ndarray) -> np.ndarray:
        return slot_mapping(table, row_of, positions, self.block_size)

    def _propose_tree(self, rows: list[_Row], table: np.ndarray) -> torch.Tensor:
        """Each row's first `limit` nodes of the tree, in node order: drafts [len(rows), max limit] (module
        docstring)."""
        tree, limits = self.tree, [r.limit for r in rows]
        keys = DraftKeys.of([r.request for r in rows], tree.depth)
        params = torch.from_numpy(DraftKeys.argmax_params(len(rows)) if keys is None else keys.params)
        drafts = torch.zeros((len(rows), max(limits)), dtype=torch.int64, device=self.device)
        logits = self._catch_up(rows, table, torch.from_numpy(table).to(self.device, non_blocking=True))
        parents = [(i, -1) for i in range(len(rows))]  # (row, node) of each row of `logits`; -1: the root
        while True:
            kids, fed = tree.expand(parents, limits)
            depths = [0 if node < 0 else tree.depths[node] for _, node in parents]
            at = [i for i, _ in parents]
            row_keys = torch.from_numpy(np.zeros(len(at), dtype=np.int64) if keys is None else keys.keys[depths, at])
            tokens = ranked(logits, [p[at].to(self.device) for p in params], row_keys.to(self.device),
                            max(map(len, kids)), self.sampling_kernels)
            for r, ((i, _), k) in enumerate(zip(parents, kids)):
                drafts[i, k] = tokens[r, :len(k)]
            if not fed:
                return drafts
            parents = [(i, c) for _, i, c in fed]
            logits = self._forward_nodes(rows, parents, drafts, table)

    def _forward_nodes(self, rows: list[_Row], nodes: list[tuple[int, int]], drafts: torch.Tensor,
                       table: np.ndarray) -> torch.Tensor:
        """Feed the tree `nodes` [(row, node)], grouped by row: their logits [len(nodes), V] (roots at N - 1)."""
        level = self.tree.level(nodes, [r.n - 1 for r in rows])
        sub_table = table[level.rows]
        return self._draft(drafts[[i for i, _ in nodes], [c for _, c in nodes]], level.positions,
                           self._slots(sub_table, level.row_of, level.slot_positions), level.query_start,
                           level.seq_lens, torch.from_numpy(sub_table).to(self.device, non_blocking=True),
                           TreeMask.of(level.ctx, level.bits, self.device))

    def _draft(self, ids: np.ndarray | torch.Tensor, positions: np.ndarray, slots: np.ndarray,
               query_start: np.ndarray, seq_lens: np.ndarray, table_dev: torch.Tensor,
               tree_mask: TreeMask | None = None) -> torch.Tensor:
        """One eager forward of a flat batch (`ids` on the host or already on the device); returns the logits at
        each sequence's last row [B, V], or at every row with a `tree_mask` (tree nodes)."""
        last = query_start[1:] - 1
        longs = [positions, slots, last] + ([ids] if isinstance(ids, np.ndarray) else [])
        moved = packed_to_device(longs, np.int64, self.device)
        ints = packed_to_device([query_start, seq_lens], np.int32, self.device)
        starts_cpu, lens_cpu = query_start.tolist(), seq_lens.tolist()
        metadata = AttentionMetadata(
            slot_mapping=moved[1], query_start_loc=ints[0], seq_lens=ints[1], block_tables=table_dev,
            max_query_len=int((query_start[1:] - query_start[:-1]).max()), max_seq_len=max(lens_cpu),
            query_start_loc_cpu=starts_cpu, seq_lens_cpu=lens_cpu, tree_mask=tree_mask)
        with set_attention_metadata(metadata):
            hidden = self.model(moved[3] if len(moved) > 3 else ids, moved[0])
        if tree_mask is None and len(last) != len(hidden):  # decode steps: every row is a last row
            hidden = hidden.index_select(0, moved[2])
        return self.model.compute_logits(hidden)

