"""Detokenize new tokens, find stop strings, and build RequestOutputs (one per user request,
gathering its n parallel samples)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lamina.engine.detokenizer import IncrementalDetokenizer
from lamina.engine.request import Request
from lamina.loader.tokenizer import Tokenizer
from lamina.outputs import CompletionOutput, RequestOutput

# Called when the detokenizer finds a stop string in a request's text.
StopCallback = Callable[[Request, str], None]


@dataclass
class _Sample:
    request: Request
    detokenizer: IncrementalDetokenizer | None
    num_seen_tokens: int = 0


class _Group:
    """One user request: its samples in index order; `stream` False: an output only when it finishes."""

    def __init__(self, request_id: str, samples: list[_Sample], stream: bool) -> None:
        self.request_id = request_id
        self.samples = samples
        self.stream = stream

    @property
    def finished(self) -> bool:
        if len(self.samples) == 1:
            return self.samples[0].request.is_finished
        return all(s.request.is_finished for s in self.samples)


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer
        self._groups: dict[str, _Group] = {}
        self._group_of: dict[str, _Group] = {}

    def add_group(self, request_id: str, requests: list[Request], stream: bool = True) -> None:
        samples = [_Sample(r, self._make_detokenizer(r)) for r in requests]
        group = _Group(request_id, samples, stream)
        self._groups[request_id] = group
        for request in requests:
            self._group_of[request.request_id] = group

    def sample_ids(self, request_id: str) -> list[str]:
        group = self._groups.get(request_id)
        return [] if group is None else [s.request.request_id for s in group.samples]

    def _make_detokenizer(self, request: Request) -> IncrementalDetokenizer | None:
        if self.tokenizer is None:
            return None
        params = request.sampling_params
        return IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids, params.skip_special_tokens,
                                      params.stop_list, params.include_stop_str_in_output)

    def process(self, requests: list[Request], on_stop: StopCallback) -> list[RequestOutput]:
        """Detokenize the new tokens of `requests` (changed this step) and return the outputs of
        their groups (of streaming groups, and of groups that finished); finished groups are forgotten."""
        touched: dict[str, _Group] = {}
        for request in requests:
            group = self._group_of.get(request.request_id)
            if group is None:
                continue
            self._detokenize(group.samples[request.sample_index], on_stop)
            touched[group.request_id] = group
        outputs = [self._make_output(g) for g in touched.values() if g.stream or g.finished]
        for group in touched.values():
            if group.finished:
                self._forget(group)
        return outputs

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
            on_stop(request, stop)

    def _make_output(self, group: _Group) -> RequestOutput:
        first = group.samples[0].request
        return RequestOutput(
            request_id=group.request_id, prompt=first.prompt, prompt_token_ids=first.prompt_token_ids,
            outputs=[self._completion(s) for s in group.samples], finished=group.finished,
            metrics=first.metrics, num_cached_tokens=first.metrics.num_cached_tokens)

    def _completion(self, sample: _Sample) -> CompletionOutput:
        request = sample.request
        return CompletionOutput(
            index=request.sample_index, text=self._visible_text(sample),
            token_ids=list(request.output_token_ids),
            cumulative_logprob=request.cumulative_logprob if request.logprobs is not None else None,
            logprobs=list(request.logprobs) if request.logprobs is not None else None,
            finish_reason=request.finish_reason, stop_reason=request.stop_reason)

    @staticmethod
    def _visible_text(sample: _Sample) -> str:
        """All text once the request finished; while running, what no stop string can still cut."""
        detok = sample.detokenizer
        if detok is None:
            return ""
        return detok.output_text if sample.request.is_finished else detok.visible_text

    def abort(self, request_id: str) -> RequestOutput | None:
        group = self._groups.get(request_id)
        if group is None:
            return None
        output = self._make_output(group)
        self._forget(group)
        return output

    def _forget(self, group: _Group) -> None:
        self._groups.pop(group.request_id, None)
        for sample in group.samples:
            self._group_of.pop(sample.request.request_id, None)

    def has_unfinished(self) -> bool:
        return bool(self._groups)
