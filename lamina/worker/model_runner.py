"""ModelRunner: the only place that builds tensors. One call launches one engine step.

`execute_model` applies the step message to the worker's copies of its requests (BatchState), queues the
step's work on the device and returns a `PendingStep`, whose sampled tokens stay on the device until
`result()` reads them (the step's one host sync) and records them in BatchState. A `decode_ahead` step is
launched before the previous step's result is read: its input ids are that step's samples, copied on the
device.
"""
from __future__ import annotations

import functools
import random
from collections.abc import Callable

import numpy as np
import torch

from lamina.attention.metadata import set_attention_metadata
from lamina.failures import is_fatal
from lamina.kernels import compile_counter
from lamina.kv.cache import attention_layers, move_kv
from lamina.layers.sampler import Sampler, SamplerOutput, SamplingMetadata, uses_sampling_kernel
from lamina.layers.sampling_metadata import min_tokens_mask, philox_keys
from lamina.sampling_params import SamplingParams
from lamina.spec.draft_tree import DraftTree
from lamina.step import DRAFT_ON_DEVICE, ModelRunnerOutput, SchedulerOutput
from lamina.worker.batch_state import BatchState
from lamina.worker.cuda_graphs import CudaGraphRunner, GraphOutputs
from lamina.worker.drafter import Drafter
from lamina.worker.graph_sampling import graph_sampled, slot_sampling, split_by_drafts, verify_positions
from lamina.worker.input_batch import DevicePatch, HostBatch, plan_batch, to_device
from lamina.worker.pending_step import PendingStep, Verified
from lamina.worker.penalty_state import PenaltyState
from lamina.worker.prompt_logprobs import PromptLogprobsResult, split_prompt_rows


def _select_rows(t: torch.Tensor | None, rows: list[int], device: torch.device) -> torch.Tensor | None:
    """t[rows]: a view when rows are 0..n-1 (the usual step), else one index copy (None for None: a step's
    argmax rows where no graph computed them)."""
    if t is None:
        return None
    if rows == list(range(len(rows))):
        return t[:len(rows)]
    return t.index_select(0, torch.from_numpy(np.array(rows, dtype=np.int64)).to(device, non_blocking=True))


class ModelRunner:
    def __init__(self, model: torch.nn.Module, block_size: int, vocab_size: int, device: torch.device,
                 seed: int, drafter: Drafter | None = None, tree: DraftTree | None = None) -> None:
        """`drafter`: runs the worker-side proposer after each step's tokens are known (None: nothing drafts
        here); every request then gets a salt (BatchState) that keys the rows verifying its drafts, which the
        drafts were drawn with (lamina/spec/draft_sampling.py). `tree`: the drafts are the first nodes of this
        tree (lamina/spec/draft_tree.py), not chains."""
        self.model = model
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.device = device
        salts = None if drafter is None else random.Random(f"{seed}/salts")
        self.states = BatchState(PenaltyState(vocab_size, device), salts)
        self.sampler = Sampler(generator=torch.Generator(device).manual_seed(seed))
        self._step_keys = random.Random(seed)  # keys of the rows without a seed, fresh every step
        self._last: PendingStep | None = None  # the step launched last (a decode_ahead step reads its tokens)
        self.kernel_sampling = uses_sampling_kernel(device)  # the one place that picks the sampling path
        self.graphs: CudaGraphRunner | None = None  # set by the Worker when decode steps are captured
        self.drafter = drafter
        self.tree = tree
        self._prompt_logprobs: PromptLogprobsResult | None = None  # the step's scored prompt rows (execute_model)

    @torch.inference_mode()
    def execute_model(self, scheduled: SchedulerOutput) -> PendingStep:
        """Apply the message to the worker's request copies and queue the step on the device."""
        compiles = compile_counter.count()
        self._prompt_logprobs = None  # set by _execute when the step scores prompt tokens
        pending = self._execute(scheduled)
        if scheduled.guesses:  # launched on guesses (n-gram drafts, no drafter): a failed one's rows are void
            pending.on_result = functools.partial(self.states.record, guesses=scheduled.guesses)
        pending.num_compiles = compile_counter.count() - compiles
        pending.add_prompt_logprobs(self._prompt_logprobs)
        return pending

    def _draft_after(self, pending: PendingStep, scheduled: SchedulerOutput, host: HostBatch,
                     hidden: torch.Tensor) -> PendingStep:
        """Let the drafter propose for `scheduled.draft_limits` once the step's tokens are read."""
        if self.drafter is None or not scheduled.draft_limits or pending.on_result is None:
            return pending
        starts, row = {}, 0
        for req_id, k in zip(host.sampling_req_ids, host.num_draft_tokens):
            starts[req_id], row = row, row + k + 1
        record, drafter, states = pending.on_result, self.drafter, self.states  # not self: the runner keeps the
        # step (self._last), and a cycle through the runner would outlive a dropped engine (engine.freeze_heap)

        def record_and_draft(output: ModelRunnerOutput) -> None:
            record(output)
            drafter.draft(scheduled.draft_limits, output, states, hidden, starts)  # never raises
        pending.on_result = record_and_draft
        return pending

    def _execute(self, scheduled: SchedulerOutput) -> PendingStep:
        self.states.apply(scheduled)
        if self.drafter is not None:
            self.drafter.forget(scheduled.finished_req_ids + scheduled.preempted_req_ids)
        previous, self._last = self._last, None
        if scheduled.is_empty:
            return PendingStep([], None)
        host = plan_batch(scheduled, self.states, self.block_size, self.tree)
        ahead_ids = self._ahead_input_ids(host.sampling_req_ids, previous) if scheduled.decode_ahead else None
        drafts = self._held_drafts(host)
        out = self._forward(host, ahead_ids, drafts)
        hidden, self._prompt_logprobs = split_prompt_rows(self.model, out.hidden, host)
        if not host.sampling_req_ids:
            return PendingStep([], None)
        logits, argmax = out.logits, None
        if logits is None:
            logits = self.model.compute_logits(hidden)
        else:
            logits = logits[:len(hidden)]
            argmax = out.argmax[:len(hidden)] if self._all_greedy(host.sampling_req_ids) else None
        sampled = None if out.sampled is None else out.sampled[:len(hidden)]  # the graph drew them (slot_sampling)
        if any(host.num_draft_tokens):
            draft_ids = host.draft_token_ids if drafts is None else drafts.values
            verify = self._verify(logits, argmax, host, draft_ids, sampled)
            self._last = self._draft_after(verify, scheduled, host, hidden)
            return self._last
        req_ids, positions = host.sampling_req_ids, host.sample_positions
        if sampled is not None:
            tokens = self._graph_sampled(logits, sampled, req_ids)
            self._last = self._draft_after(self._pending(req_ids, tokens), scheduled, host, hidden)
            return self._last
        try:
            out = self._sample(logits, req_ids, positions, argmax=argmax)
        except Exception as err:  # noqa: BLE001 - one row's failure must not fail the batch
            if is_fatal(err):
                raise
            return self._draft_after(self._sample_isolating(logits, req_ids, positions, err), scheduled, host,
                                     hidden)
        self._last = self._draft_after(self._pending(req_ids, out), scheduled, host, hidden)
        return self._last

    def _graph_sampled(self, logits: torch.Tensor, sampled: torch.Tensor, req_ids: list[str]) -> SamplerOutput:
        """graph_sampled for rows of `req_ids` (one each)."""
        held = self.states.requests
        return graph_sampled(logits, sampled, [held[r].sampling_params.logprobs for r in req_ids])

    def _all_greedy(self, req_ids: list[str]) -> bool:
        """Whether every request samples greedily (only then can a step take the argmax its graph computed)."""
        held = self.states.requests
        return all(held[r].sampling_params.greedy for r in req_ids)

    def _verify(self, logits: torch.Tensor, argmax: torch.Tensor | None, host: HostBatch,
                draft_ids: list[int] | torch.Tensor, sampled: torch.Tensor | None = None) -> PendingStep:
        """A step with drafts (`draft_ids`, flat: on the host, or on the device when the drafter holds them):
        requests without drafts sample as usual from their one row (keyed as in any other step, isolated as in
        any other step when a row raises); the others' k + 1 rows are verified by `_verify_drafts` (the target
        distribution exactly). `argmax`: each row's, when the graph computed it and every row is greedy (else
        None); `sampled`: every row's token, when the graph drew them (else None)."""
        plain, plain_rows, spec, spec_rows, num_drafts = split_by_drafts(host.sampling_req_ids,
                                                                          host.num_draft_tokens)
        positions = [p for p, k in zip(host.sample_positions, host.num_draft_tokens) if k]
        verified, failed = self._verify_drafts(_select_rows(logits, spec_rows, self.device), spec, num_drafts,
                                               draft_ids, positions, _select_rows(argmax, spec_rows, self.device),
                                               _select_rows(sampled, spec_rows, self.device))
        if verified is not None and self.tree is not None:
            verified.tree, verified.on_paths = self.tree, self._kv_mover(spec, positions)
        if not plain:
            return PendingStep([], None, failed=failed, on_result=self.states.record, verified=verified)
        positions = [p for p, k in zip(host.sample_positions, host.num_draft_tokens) if not k]
        plain_logits = _select_rows(logits, plain_rows, self.device)
        if sampled is not None:
            out = self._graph_sampled(plain_logits, _select_rows(sampled, plain_rows, self.device), plain)
            return self._pending(plain, out, failed, verified)
        try:
            out = self._sample(plain_logits, plain, positions, argmax=_select_rows(argmax, plain_rows, self.device))
        except Exception as err:  # noqa: BLE001 - one row's failure must not fail the batch
            if is_fatal(err):
                raise
            return self._sample_isolating(plain_logits, plain, positions, err, failed, verified)
        return self._pending(plain, out, failed, verified)

    def _verify_drafts(self, logits: torch.Tensor, spec: list[str], num_drafts: list[int],
                       draft_ids: list[int] | torch.Tensor, positions: list[int], argmax: torch.Tensor | None = None,
                       sampled: torch.Tensor | None = None) -> tuple[Verified | None, dict[str, str]]:
        """The drafting requests' tokens: every one of their k + 1 rows is sampled as any row is (keyed by its own
        position; `sampled`: drawn so by the graph already); reading the step keeps a request's drafts while they
        equal its samples, then one sample more (lamina.layers.accept_drafts: rejection sampling exactly for
        one-hot proposals, which every proposer here makes). Logprobs come from each row's raw logits. If sampling
        raises, those requests fail and the rest of the step goes on."""
        rows = [r for r, k in zip(spec, num_drafts) for _ in range(k + 1)]
        try:
            out = (self._graph_sampled(logits, sampled, rows) if sampled is not None else
                   self._sample(logits, rows, verify_positions(positions, num_drafts, self.tree), salted=True,
                                argmax=argmax))
        except Exception as err:  # noqa: BLE001 - the drafting requests end with the error, the others go on
            if is_fatal(err):
                raise
            return None, {r: f"verifying drafts failed: {err!r}" for r in spec}
        num_logprobs = [self.states.requests[r].sampling_params.logprobs for r in spec]
        return Verified(spec, out.sampled_token_ids, num_drafts, draft_ids, out.logprobs, num_logprobs), {}

    def _kv_mover(self, req_ids: list[str], sample_positions: list[int]) -> Callable[[dict[str, list[int]]], None]:
        """What moves the KV of each request's accepted tree nodes to the slots of their positions once the paths
        are read (DraftTree.moves; the root of request i is at sample_positions[i] - 1)."""
        caches = [layer.kv_cache for layer in attention_layers(self.model)]
        tree, block_size = self.tree, self.block_size
        tables = {r: (p - 1, list(self.states.requests[r].block_ids)) for r, p in zip(req_ids, sample_positions)}

        def slot(blocks: list[int], position: int) -> int:
            return blocks[position // block_size] * block_size + position % block_size

        def move(paths: dict[str, list[int]]) -> None:
            src, dst = [], []
            for req_id, path in paths.items():
                root, blocks = tables[req_id]
                for a, b in tree.moves(path):
                    src.append(slot(blocks, root + a))
                    dst.append(slot(blocks, root + b))
            move_kv(caches, src, dst)
        return move

    def _pending(self, req_ids: list[str], out: SamplerOutput, failed: dict[str, str] | None = None,
                 verified: Verified | None = None) -> PendingStep:
        """Count the samples for penalties (on the device) and wrap the step (with its verified drafts, if any)."""
        self.states.penalties.update(req_ids, out.sampled_token_ids)
        held = self.states.requests
        num_logprobs = [] if out.logprobs is None else [held[r].sampling_params.logprobs for r in req_ids]
        return PendingStep(req_ids, out.sampled_token_ids, out.logprobs, num_logprobs, failed or {},
                           on_result=self.states.record, verified=verified)

    def _sample(self, logits: torch.Tensor, req_ids: list[str], positions: list[int],
                salted: bool = False, argmax: torch.Tensor | None = None) -> SamplerOutput:
        """Row i samples req_ids[i]'s token at index positions[i] of its tokens; a seeded row's draw depends only
        on its seed and that index (the kernel's philox key, or a torch generator seeded with the same key).
        `salted`: an unseeded request's rows are keyed by its salt (BatchState) as a seed, as the drafts they
        verify were drawn (lamina/spec/draft_sampling.py); else they draw from the shared stream. `argmax`: each
        row's, computed in the step's CUDA graph (Sampler.forward)."""
        held = self.states.requests
        states = [held[r] for r in req_ids]
        params = [s.sampling_params for s in states]
        seeds = [s.seed if salted else p.seed for s, p in zip(states, params)]
        keys = self._philox_keys(params, seeds, positions)
        generators = {}
        if keys is None:  # the torch path, or every row greedy: a generator for each seeded row that draws
            generators = _seeded_generators([None if p.greedy else s for p, s in zip(params, seeds)], positions,
                                            self.device)
        min_tokens = None
        if any(p.min_tokens for p in params):
            min_tokens = min_tokens_mask(params, [s.num_output_tokens for s in states],
                                         [s.eos_token_ids for s in states], self.vocab_size, self.device)
        metadata = SamplingMetadata.build(params, self.vocab_size, self.device, generators=generators, seeds=keys,
                                          penalties=self.states.penalties.tensors(req_ids, params),
                                          min_tokens=min_tokens)
        return self.sampler(logits, metadata, argmax=argmax)

    def _sample_isolating(self, logits: torch.Tensor, req_ids: list[str], positions: list[int],
                          err: Exception, failed: dict[str, str] | None = None,
                          verified: Verified | None = None) -> PendingStep:
        """The batch's sampling raised: the rows that raise alone fail (PendingStep.failed, with `failed`
        already), the others are sampled together again. If no row raises alone the batch is at fault: `err` is
        raised again. `verified`: the step's verified drafts, which go along."""
        failed, earlier = {}, failed or {}
        for row, req_id in enumerate(req_ids):
            try:
                self._sample(logits[row:row + 1], [req_id], positions[row:row + 1])
            except Exception as row_err:  # noqa: BLE001 - this row's request ends with the error
                if is_fatal(row_err):
                    raise
                failed[req_id] = f"sampling failed: {row_err!r}"
        if not failed:
            raise err
        rows = [i for i, r in enumerate(req_ids) if r not in failed]
        if not rows:
            return PendingStep([], None, failed={**earlier, **failed}, on_result=self.states.record,
                               verified=verified)
        kept = [req_ids[i] for i in rows]
        out = self._sample(_select_rows(logits, rows, self.device), kept, [positions[i] for i in rows])
        self._last = self._pending(kept, out, {**earlier, **failed}, verified)
        return self._last

    def _ahead_input_ids(self, req_ids: list[str], previous: PendingStep | None) -> torch.Tensor:
        """The tokens `previous` samples for the requests of a decode_ahead step, in batch order."""
        if previous is None or previous.sampled is None:
            raise ValueError("a decode_ahead step needs the pending step it follows")
        rows = [previous.row_of(r) for r in req_ids]
        if None in rows:
            raise ValueError("a decode_ahead request does not sample in the pending step")
        return _select_rows(previous.sampled, rows, self.device)

    def _held_drafts(self, host: HostBatch) -> DevicePatch | None:
        """The drafts the step verifies when the drafter holds them (DRAFT_ON_DEVICE in the message; then every
        draft of the step is): their ids, taken from the drafter on the device, and their input rows (rows
        1..k of a request's k + 1 logits rows)."""
        if DRAFT_ON_DEVICE not in host.draft_token_ids:
            return None
        if self.drafter is None or any(t != DRAFT_ON_DEVICE for t in host.draft_token_ids):
            raise ValueError("scheduled_spec_decode_tokens: DRAFT_ON_DEVICE entries need a worker-side proposer, "
                             "and no host drafts beside them in one step")
        spec = [(r, k) for r, k in zip(host.sampling_req_ids, host.num_draft_tokens) if k]
        rows, row = [], 0
        for k in host.num_draft_tokens:
            rows += host.logits_indices[row + 1:row + 1 + k]
            row += k + 1
        return self.drafter.take([r for r, _ in spec], [k for _, k in spec], rows)

    def _forward(self, host: HostBatch, ahead_ids: torch.Tensor | None, drafts: DevicePatch | None = None
                 ) -> GraphOutputs:
        """The rows in logits_indices: their hidden states, and their logits, argmax and samples where a captured
        graph computed them. Batches a captured graph holds (CudaGraphRunner) replay it; the rest run eagerly.
        `ahead_ids` overwrite the input ids, `drafts` some of them."""
        graph = None if self.graphs is None else self.graphs.graph_for(host)
        if graph is not None:
            sampling = None
            if self.graphs.samples(graph):
                sampling = slot_sampling(host, self.states.requests, self.vocab_size, self.tree,
                                         lambda: self._step_keys.getrandbits(63))
            out = self.graphs.run(host, graph, ahead_ids, drafts, sampling)
            # all rows, unless a one-token prompt chunk rides among the decodes (it samples nothing)
            rows = host.logits_indices
            return GraphOutputs(*(_select_rows(t, rows, self.device)
                                  for t in (out.hidden, out.logits, out.argmax, out.sampled)))
        batch = to_device(host, self.device)
        if ahead_ids is not None:
            batch.input_ids.copy_(ahead_ids)
        if drafts is not None:
            drafts.apply(batch.input_ids)
        with set_attention_metadata(batch.attn_metadata):
            hidden = self.model(batch.input_ids, batch.positions)
        return GraphOutputs(hidden[batch.logits_indices])

    def _philox_keys(self, params: list[SamplingParams], seeds: list[int | None], positions: list[int]
                     ) -> list[int] | None:
        """Per-row keys of the sampling kernel (lamina.layers.sampler) from the requests' seeds (BatchState); None
        when it is not used: on the torch path (CPU, or no triton) and in all-greedy steps (an argmax draws
        nothing)."""
        if not self.kernel_sampling or all(p.greedy for p in params):
            return None
        return philox_keys(seeds, positions, self._step_keys.getrandbits(63))


def _seeded_generators(seeds: list[int | None], positions: list[int],
                       device: torch.device) -> dict[int, torch.Generator]:
    """Row -> a generator of each row with a seed (BatchState's: the request's, or its salt) on the torch
    path, seeded with the key the sampling kernel would use (philox_keys: the seed and the index of the token
    sampled), so a seeded request's tokens do not depend on the batch, on async scheduling, on preemption or on
    drafts. Any integer is a seed (the key is 64 bits)."""
    keys = philox_keys(seeds, positions, step_key=0)
    return {row: torch.Generator(device).manual_seed(key % 2**64)
            for row, (seed, key) in enumerate(zip(seeds, keys)) if seed is not None}
