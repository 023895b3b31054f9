"""Detokenize new tokens, find stop strings, and build RequestOutputs (one per user request, gathering its
n parallel samples) in the kind its SamplingParams.output_kind asks for:

    CUMULATIVE   every step: all text, token ids and logprobs so far, every sample    O(n) per output
    DELTA        every step: only what is new since the last output, and only the     O(new) per output
                 samples that have news (a sample's finish_reason comes once, with its last delta)
    FINAL_ONLY   one complete output when every sample has finished

A streamed request of n tokens costs O(n) in all as DELTA, O(n^2) as CUMULATIVE (each output copies
everything so far); so streaming servers ask for DELTA.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lamina.engine import prompt_logprobs
from lamina.engine.detokenizer import IncrementalDetokenizer
from lamina.engine.request import Request
from lamina.loader.tokenizer import Tokenizer
from lamina.outputs import CompletionOutput, PromptLogprobs, RequestOutput
from lamina.sampling_params import RequestOutputKind

# Called when the detokenizer finds a stop string in a request's text.
StopCallback = Callable[[Request, str], None]
# Called with the complete final output (as FINAL_ONLY would give it) of every request that finishes.
FinishedCallback = Callable[[RequestOutput], None]


@dataclass
class _Sample:
    request: Request
    detokenizer: IncrementalDetokenizer | None
    num_seen_tokens: int = 0  # tokens detokenized
    num_sent_tokens: int = 0  # DELTA: tokens already carried by an output
    finish_sent: bool = False  # DELTA: its finish_reason went out; it is in no later output

    @property
    def has_news(self) -> bool:
        """DELTA: new tokens, or a finish not yet reported (text only ever comes with one of those)."""
        request = self.request
        return self.num_sent_tokens < request.num_output_tokens or (request.is_finished and not self.finish_sent)


class _Group:
    """One user request: its samples in index order, and the kind of output it asked for."""

    def __init__(self, request_id: str, samples: list[_Sample]) -> None:
        self.request_id = request_id
        self.samples = samples
        self.kind = samples[0].request.sampling_params.output_kind
        self.prompt_logprobs_sent = False  # DELTA: they go out once, in the first output that has them

    @property
    def finished(self) -> bool:
        if len(self.samples) == 1:
            return self.samples[0].request.is_finished
        return all(s.request.is_finished for s in self.samples)


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer
        self.on_finished: FinishedCallback | None = None
        self._groups: dict[str, _Group] = {}
        self._group_of: dict[str, _Group] = {}

    def add_group(self, request_id: str, requests: list[Request]) -> None:
        samples = [_Sample(r, self._make_detokenizer(r)) for r in requests]
        group = _Group(request_id, samples)
        self._groups[request_id] = group
        for request in requests:
            self._group_of[request.request_id] = group

    def sample_ids(self, request_id: str) -> list[str]:
        group = self._groups.get(request_id)
        return [] if group is None else [s.request.request_id for s in group.samples]

    def samples_of(self, sample_id: str) -> list[Request]:
        """Every sample of the user request that sample `sample_id` belongs to ([] if it is unknown)."""
        group = self._group_of.get(sample_id)
        return [] if group is None else [s.request for s in group.samples]

    def _make_detokenizer(self, request: Request) -> IncrementalDetokenizer | None:
        if self.tokenizer is None:
            return None
        params = request.sampling_params
        return IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids, params.skip_special_tokens,
                                      params.stop_list, params.include_stop_str_in_output)

    def process(self, requests: list[Request], on_stop: StopCallback) -> list[RequestOutput]:
        """Detokenize the new tokens of `requests` (changed this step) and return their groups' outputs
        (each in its kind; FINAL_ONLY groups only once finished); finished groups are forgotten."""
        touched: dict[str, _Group] = {}
        for request in requests:
            group = self._group_of.get(request.request_id)
            if group is None:
                continue
            self._detokenize(group.samples[request.sample_index], on_stop)
            touched[group.request_id] = group
        # Every output is built before any group is forgotten: if building one raises, no request has
        # finished unseen (the engine then fails this step's requests, lamina/failures.py).
        built = [(group, self._make_output(group)) for group in touched.values()
                 if group.kind is not RequestOutputKind.FINAL_ONLY or group.finished]
        finals = [(group, self._complete(group, output)) for group, output in built if group.finished]
        for group, final in finals:
            self._finish(group, final)
        return [output for _, output in built]

    def _detokenize(self, sample: _Sample, on_stop: StopCallback) -> None:
        request, detok = sample.request, sample.detokenizer
        new_tokens = request.output_token_ids[sample.num_seen_tokens:]
        start = sample.num_seen_tokens
        sample.num_seen_tokens = request.num_output_tokens
        if detok is None or detok.finished:
            return
        stop = detok.update(new_tokens) if new_tokens else None
        if stop is None and request.is_finished:
            stop = detok.finish()  # flush a trailing partial character
        if request.logprobs is not None:
            for entry in request.logprobs[start:]:
                for token_id, logprob in entry.items():
                    if logprob.decoded_token is None:
                        logprob.decoded_token = detok.decode_token(token_id)
        if stop is not None:
            request.truncate_output(detok.num_output_tokens)  # tokens accepted after the stop are not output
            sample.num_seen_tokens = request.num_output_tokens
            on_stop(request, stop)

    def _make_output(self, group: _Group, kind: RequestOutputKind | None = None) -> RequestOutput:
        kind = group.kind if kind is None else kind
        if kind is RequestOutputKind.DELTA:
            completions = [self._delta(s) for s in group.samples if s.has_news]
        else:
            completions = [self._cumulative(s) for s in group.samples]
        first = group.samples[0].request
        errors = [s.request.error for s in group.samples if s.request.error is not None]
        return RequestOutput(
            request_id=group.request_id, prompt=first.prompt, prompt_token_ids=first.prompt_token_ids,
            outputs=completions, finished=group.finished, metrics=first.metrics,
            num_cached_tokens=first.metrics.num_cached_tokens, extra={"error": errors[0]} if errors else {},
            prompt_logprobs=self._prompt_logprobs(group, kind))

    def _prompt_logprobs(self, group: _Group, kind: RequestOutputKind) -> PromptLogprobs | None:
        """Sample 0's prompt logprobs once complete (decoded), in every output but DELTA's later ones."""
        sample = group.samples[0]
        if not prompt_logprobs.is_complete(sample.request) or (kind is RequestOutputKind.DELTA
                                                                and group.prompt_logprobs_sent):
            return None
        group.prompt_logprobs_sent = kind is RequestOutputKind.DELTA or group.prompt_logprobs_sent
        entries = sample.request.prompt_logprobs
        if sample.detokenizer is not None and entries[-1] is not None:
            for entry in entries[1:]:
                for token_id, logprob in entry.items():
                    if logprob.decoded_token is None:
                        logprob.decoded_token = sample.detokenizer.decode_token(token_id)
        return entries

    @staticmethod
    def _cumulative(sample: _Sample) -> CompletionOutput:
        """Everything so far: while running, the text no stop string can still cut (visible_text)."""
        request, detok = sample.request, sample.detokenizer
        text = "" if detok is None else detok.output_text if request.is_finished else detok.visible_text
        return CompletionOutput(
            index=request.sample_index, text=text, token_ids=list(request.output_token_ids),
            cumulative_logprob=request.cumulative_logprob if request.logprobs is not None else None,
            logprobs=list(request.logprobs) if request.logprobs is not None else None,
            finish_reason=request.finish_reason, stop_reason=request.stop_reason)

    @staticmethod
    def _delta(sample: _Sample) -> CompletionOutput:
        """What is new since this sample's previous output; concatenated, the deltas are _cumulative."""
        request, detok = sample.request, sample.detokenizer
        start = sample.num_sent_tokens
        sample.num_sent_tokens, sample.finish_sent = request.num_output_tokens, request.is_finished
        text = "" if detok is None else detok.get_delta(final=request.is_finished)
        return CompletionOutput(
            index=request.sample_index, text=text, token_ids=request.output_token_ids[start:],
            cumulative_logprob=request.cumulative_logprob if request.logprobs is not None else None,
            logprobs=request.logprobs[start:] if request.logprobs is not None else None,
            finish_reason=request.finish_reason, stop_reason=request.stop_reason)

    def abort(self, request_id: str) -> RequestOutput | None:
        """The last output of an aborted request (in its kind), or None if it is unknown."""
        group = self._groups.get(request_id)
        if group is None:
            return None
        output = self._make_output(group)
        self._finish(group, self._complete(group, output))
        return output

    def _complete(self, group: _Group, last: RequestOutput) -> RequestOutput | None:
        """The complete final output of a finished group for on_finished (None: nobody listens). Only a
        DELTA group needs it built (once, O(n): streaming stays linear)."""
        if self.on_finished is None:
            return None
        if last.finished and group.kind is not RequestOutputKind.DELTA:
            return last
        return self._make_output(group, RequestOutputKind.FINAL_ONLY)

    def _finish(self, group: _Group, final: RequestOutput | None) -> None:
        """Report the complete final output and forget the group."""
        if self.on_finished is not None and final is not None:
            self.on_finished(final)
        self._groups.pop(group.request_id, None)
        for sample in group.samples:
            self._group_of.pop(sample.request.request_id, None)

    def has_unfinished(self) -> bool:
        return bool(self._groups)
