"""LLMEngine: requests in, one step at a time, RequestOutputs out.

    add_request -> InputProcessor -> Scheduler.schedule (a data message, lamina/step.py)
                -> Executor.execute_model (a StepFuture)
                -> [async_scheduling: Scheduler.schedule_ahead -> Executor.execute_model of the next step]
                -> StepFuture.result -> Scheduler.update_from_output
                -> [speculation: Speculator.after_tokens sets the next step's drafts; async_scheduling: the next
                   step is scheduled and launched now (LLMEngine._launches_early), unless it was launched ahead
                   (after a step verifying n-gram drafts: on the guess that all are accepted,
                   Scheduler.schedule_guessed)]
                -> OutputProcessor (detokenize, stop strings, outputs in each request's output_kind)

The engine owns the requests; the executor's worker(s) own their copies of them and every tensor.

With async scheduling the step launched ahead (or early, after the tokens it follows) is the next call's
step: its device work overlaps this call's host work (reading tokens, stop checks, detokenizing, building
outputs). A step with drafts cannot be launched ahead (its drafts follow this step's tokens) but is launched
early, so that its device work still overlaps this step's outputs; so is a step without drafts that waited for
the speculator's decision, unless a request ended or waits (the caller may add requests once it sees one end).

A step that raises ends its requests with finish_reason "error" (one row's sampling: that request only),
frees their blocks, and the engine goes on; a lost device or repeated failures raise EngineBrokenError
(lamina/failures.py).
"""
from __future__ import annotations

import dataclasses
import gc
import itertools
import logging
import time
from dataclasses import dataclass

from lamina.config import EngineConfig
from lamina.device import resolve_device, resolve_dtype
from lamina.engine.defaults import fit_to_kv_capacity, log_scheduler_config, resolve_scheduler_config
from lamina.engine.input_processor import InputLimits, InputProcessor, PromptType
from lamina.engine.output_processor import OutputProcessor
from lamina.engine.request import Request, RequestStatus
from lamina.engine.scheduler import Scheduler
from lamina.engine.speculator import make_speculator
from lamina.engine.stats import SchedulerStats, StepStats
from lamina.executor.base import Executor, StepFuture
from lamina.executor.factory import make_executor
from lamina.failures import MAX_FAILED_STEPS, EngineBrokenError, is_fatal
from lamina.kv.kv_manager import KVCacheManager
from lamina.loader.hf_config import load_generation_config, load_model_arch
from lamina.loader.tokenizer import Tokenizer
from lamina.outputs import RequestOutput
from lamina.sampling_params import SamplingParams
from lamina.step import SchedulerOutput

logger = logging.getLogger(__name__)


@dataclass
class InflightStep:
    """A step launched whose results the engine has not processed: ahead (Scheduler.schedule_ahead, before the
    tokens of the step before it are known) or early (after them, before that step's outputs are processed)."""

    scheduled: SchedulerOutput
    requests: list[Request]  # the engine's requests of `scheduled`, in its order
    pending: StepFuture
    launch_seconds: float  # spent handing it to the executor (computing it, on a CPU), in the step before
    ahead: bool


class LLMEngine:
    def __init__(self, config: EngineConfig, usage: str = "offline") -> None:
        """`usage` ("offline" | "serve") picks the scheduler defaults (lamina/engine/defaults.py)."""
        asked = config.scheduler_config
        device = resolve_device(config.device)
        config = dataclasses.replace(config, scheduler_config=resolve_scheduler_config(asked, device, usage))
        self.config = config
        model_config = config.model_config
        self.arch = load_model_arch(model_config.model)
        self.tokenizer = None
        if not model_config.skip_tokenizer_init:
            self.tokenizer = Tokenizer.from_pretrained(model_config.tokenizer or model_config.model)
        cache = config.cache_config
        self.device, self.dtype = device, resolve_dtype(model_config.dtype, self.arch, device)
        self.executor: Executor = make_executor(config, self.arch)
        self.num_blocks = num_blocks = self.executor.determine_num_blocks()
        self.executor.initialize_cache(num_blocks)
        self.max_model_len = self.executor.max_model_len
        self.kv_capacity_tokens = (num_blocks - 1) * cache.block_size
        sched = fit_to_kv_capacity(config.scheduler_config, asked, device, self.kv_capacity_tokens)
        self.config = config = dataclasses.replace(config, scheduler_config=sched)
        log_scheduler_config(sched, asked, device, usage)
        self.executor.compile_and_capture(sched.max_num_seqs)
        self.kv_manager = KVCacheManager(num_blocks, cache.block_size, cache.enable_prefix_caching)
        spec = config.speculative_config
        self.scheduler = Scheduler(sched, self.kv_manager, self.max_model_len)
        self.speculator = None if spec is None else make_speculator(spec, config, device, self.max_model_len,
                                                                     self.scheduler.stats.spec)
        if self.speculator is not None:
            self.scheduler.num_lookahead_tokens = self.speculator.num_lookahead_tokens
        limits = InputLimits(self.arch.vocab_size, self.max_model_len, model_config.max_logprobs)
        self.input_processor = InputProcessor(self.tokenizer, limits, self._eos_token_ids())
        self.output_processor = OutputProcessor(self.tokenizer)
        if spec is not None and config.async_scheduling:
            logger.info("speculative decoding (%s, k=%d): steps are launched ahead only while no request drafts "
                        "(drafts need each step's tokens), else once those tokens are known",
                        spec.method, spec.num_speculative_tokens)
        self._ids = itertools.count()
        self._inflight: InflightStep | None = None  # launched (ahead or early), not yet processed
        self._current: list[Request] = []  # the requests of the step being run (they fail if it raises)
        self._failed_steps = 0  # consecutive
        self.step_log: list[StepStats] | None = None  # a list: every step appends its StepStats (off: None)
        freeze_heap()

    def _eos_token_ids(self) -> frozenset[int]:
        if self.tokenizer is not None:
            return self.tokenizer.eos_token_ids
        eos = load_generation_config(self.config.model_config.model).get("eos_token_id")
        if eos is None:
            return frozenset(self.arch.eos_token_ids)
        return frozenset(eos if isinstance(eos, list) else [eos])

    def add_request(self, prompt: PromptType, params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None) -> str:
        """Validate and queue one request (n samples); returns its id. step() returns its outputs in the
        kind `params.output_kind` asks for: CUMULATIVE, DELTA (streaming) or FINAL_ONLY (one, at the end)."""
        request_id = request_id if request_id is not None else str(next(self._ids))
        self.add_processed(request_id, self.process_inputs(prompt, params, request_id, arrival_time))
        return request_id

    def process_inputs(self, prompt: PromptType, params: SamplingParams | None, request_id: str,
                       arrival_time: float | None = None) -> list[Request]:
        """Tokenize and validate without touching engine state (safe to call from another thread)."""
        params = params if params is not None else SamplingParams()
        return self.input_processor.make_requests(request_id, prompt, params, arrival_time)

    def add_processed(self, request_id: str, requests: list[Request]) -> None:
        """Queue the samples made by process_inputs (on the thread that runs step())."""
        if self.output_processor.sample_ids(request_id):
            raise ValueError(f"request_id: {request_id!r} is already in use")
        self.output_processor.add_group(request_id, requests)
        for request in requests:
            self.scheduler.add_request(request)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request and free its KV blocks; returns its last output (finish_reason "abort")."""
        for sample_id in self.output_processor.sample_ids(request_id):
            self.scheduler.finish_request(sample_id, RequestStatus.FINISHED_ABORTED)
        return self.output_processor.abort(request_id)

    def step(self) -> list[RequestOutput]:
        """Run one step and return its outputs. With async_scheduling, the step after it is launched
        first when the scheduler can decide it already (Scheduler.schedule_ahead): the device then
        computes it while the host turns this step's tokens into outputs.

        If the step raises, its requests end with finish_reason "error" (their outputs are returned) and
        the engine stays usable; EngineBrokenError when the device is lost or steps keep failing."""
        start = time.perf_counter()
        try:
            outputs = self._step(start)
        except Exception as err:  # noqa: BLE001 - the step's requests get the error, not every request
            return self._step_failed(err)
        self._failed_steps = 0
        return outputs

    def _step(self, start: float) -> list[RequestOutput]:
        self._current = []
        step, self._inflight = self._inflight, None
        launched_ahead = step is not None and step.ahead
        if step is None:
            step = self._launch(self._schedule(), ahead=False)
            step.launch_seconds = 0.0  # launched in this call: its launch is in this call's time
        scheduled, pending, self._current = step.scheduled, step.pending, step.requests
        if self.config.async_scheduling and not pending.failed:
            ahead = self._schedule_ahead(step)
            if ahead is not None:
                self._inflight = self._launch(ahead, ahead=True)
        waited = time.perf_counter()
        result = pending.result()
        waited = time.perf_counter() - waited
        changed = self.scheduler.update_from_output(scheduled, result)
        changed += self._fail_siblings(changed)
        guessed = self._inflight is not None and bool(self._inflight.scheduled.guesses)
        if guessed and not self._guesses_held(self._inflight.scheduled):
            self._inflight, guessed = None, False  # every guess failed: the next step follows the tokens read
        if self.speculator is not None:
            self.speculator.after_tokens(scheduled, result, self.scheduler.running, next_guessed=guessed,
                                         next_launched=self._inflight is not None)
            if self.config.async_scheduling and self._inflight is None and self._launches_early(step):
                self._inflight = self._launch(self._schedule(), ahead=False)
        outputs = self.output_processor.process(changed, self._stop_string_found)
        # The step's time: this call's, less the launch of the step after it, plus its own launch when that
        # was in the call before (a CPU computes a step as it is launched, a GPU only queues it).
        next_launch = self._inflight.launch_seconds if self._inflight is not None else 0.0
        seconds = time.perf_counter() - start - next_launch + step.launch_seconds
        if self.speculator is not None:
            self.speculator.after_step(scheduled, seconds, step.requests, draining=not self.scheduler.waiting)
        if self._inflight is not None and all(r.is_finished for r in self._inflight.requests):
            self._inflight = None  # nothing left in it to wait for (its device work is stream-ordered)
        if self.step_log is not None:
            self.step_log.append(_step_stats(scheduled, launched_ahead, seconds, waited, result.num_compiles))
        return outputs

    def _schedule_ahead(self, step: InflightStep) -> SchedulerOutput | None:
        """The step after `step`, launched before its tokens are read, if it can be decided now: a decode step
        while nobody drafts (not after a step that verifies drafts, which Scheduler.schedule_ahead checks, nor
        when the speculator decides on the next one's drafts); after a step verifying n-gram drafts, the step
        on the guess that they are all accepted (Speculator.continuations)."""
        speculator = self.speculator
        if speculator is None or not speculator.wants_sync():
            return self.scheduler.schedule_ahead(step.scheduled)
        continuations = speculator.continuations(step.scheduled, step.requests)
        return self.scheduler.schedule_guessed(step.scheduled, continuations) if continuations else None

    def _launches_early(self, step: InflightStep) -> bool:
        """Whether the step after `step` (with speculation, not launched ahead) is launched now, once `step`'s
        tokens are read and the speculator has decided its drafts, so that its device work runs under `step`'s
        outputs: when it verifies drafts, or when it has none and no output need reach the caller first (no
        request of `step` ended, none waits to be admitted). Else it waits for the outputs, as without
        speculation: the caller may add requests once it sees some end, and that step admits them."""
        if self.speculator.has_drafts:
            return True
        scheduler = self.scheduler
        return bool(scheduler.running) and not scheduler.waiting and not any(r.is_finished for r in step.requests)

    def _guesses_held(self, guessed: SchedulerOutput) -> bool:
        """Whether the tokens just read bear out any guess of `guessed` (launched on guesses); each request's
        outcome is counted and told to the speculator."""
        held = self.scheduler.check_guesses(guessed)
        self.speculator.observe_guesses(held)
        return any(held.values())

    def _schedule(self) -> SchedulerOutput:
        scheduled = self.scheduler.schedule()
        if scheduled.is_empty and self.scheduler.has_unfinished_requests() and not self.scheduler.running:
            raise EngineBrokenError("scheduler made no progress: no waiting request could be admitted into "
                                    "an empty engine (this is a bug; please report it)")
        return scheduled

    def _launch(self, scheduled: SchedulerOutput, ahead: bool) -> InflightStep:
        """Hand `scheduled` to the executor (after the speculator's before_step, unless launched ahead)."""
        requests = self._requests_of(scheduled)
        self._current = self._current + requests  # they fail with it if launching raises
        if self.speculator is not None and not ahead:
            self.speculator.before_step(scheduled, requests)
        launched = time.perf_counter()
        pending = self.executor.execute_model(scheduled)
        return InflightStep(scheduled, requests, pending, time.perf_counter() - launched, ahead)

    def _step_failed(self, err: Exception) -> list[RequestOutput]:
        """End the requests of the failed step (and of the step launched ahead) with the error; raise
        EngineBrokenError (after that) when the device is lost or too many steps failed in a row."""
        self._failed_steps += 1
        logger.error("an engine step failed; its requests end with finish_reason 'error'", exc_info=err)
        ahead = self._inflight.requests if self._inflight is not None else []
        requests = list({id(r): r for r in self._current + ahead}.values())
        self._current, self._inflight = [], None
        for request in requests:
            self.scheduler.fail_request(request.request_id, f"the engine step failed: {err!r}")
        requests += self._fail_siblings(requests)
        try:
            outputs = self.output_processor.process(requests, self._stop_string_found)
        except Exception as again:  # noqa: BLE001 - the failed requests cannot even be reported
            raise EngineBrokenError(f"reporting a failed step failed too: {again!r}") from err
        if is_fatal(err):
            raise EngineBrokenError(f"the device failed: {err!r}") from err
        if self._failed_steps >= MAX_FAILED_STEPS:
            raise EngineBrokenError(f"{self._failed_steps} steps failed in a row; the last: {err!r}") from err
        return outputs

    def _requests_of(self, scheduled: SchedulerOutput) -> list[Request]:
        return [self.scheduler.requests[req_id] for req_id in scheduled.req_ids]

    def _fail_siblings(self, requests: list[Request]) -> list[Request]:
        """The other samples of an n > 1 request one of whose samples failed: the request has failed."""
        siblings: list[Request] = []
        for request in requests:
            if request.status is not RequestStatus.FINISHED_ERROR:
                continue
            for sample in self.output_processor.samples_of(request.request_id):
                if not sample.is_finished:
                    self.scheduler.fail_request(sample.request_id, request.error or "a sibling sample failed")
                    siblings.append(sample)
        return siblings

    def _stop_string_found(self, request: Request, stop: str) -> None:
        if request.is_finished:  # ended by length in the same step, but the stop string ended the text
            request.status, request.stop_reason = RequestStatus.FINISHED_STOPPED, stop
        else:
            self.scheduler.finish_request(request.request_id, RequestStatus.FINISHED_STOPPED, stop_reason=stop)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_stats(self) -> SchedulerStats:
        return self.scheduler.make_stats()

    def check_integrity(self) -> None:
        """Assert the KV block accounting is exact (no leaked blocks)."""
        self.kv_manager.check_integrity()


def freeze_heap() -> None:
    """Collect, then move every object alive after start-up (the model's modules, graphs, tokenizer, ...) out of
    the garbage collector's generations, as vLLM does: a full collection then walks only what serving allocated.
    Without it, a full collection in a benchmark process (~250k objects) took 110-130 ms on the H200's host, once
    every few thousand steps, inside whichever step triggered it."""
    gc.collect()
    gc.freeze()


def _step_stats(scheduled: SchedulerOutput, launched_ahead: bool, seconds: float, waited: float,
                compiles: int) -> StepStats:
    tokens, rows = scheduled.total_num_scheduled_tokens, len(scheduled.req_ids)
    kind = "verify" if scheduled.scheduled_spec_decode_tokens else "prefill" if tokens > rows else "decode"
    kind = f"{kind} ahead" if launched_ahead else kind
    return StepStats(kind, tokens, rows, seconds, waited, compiles)

