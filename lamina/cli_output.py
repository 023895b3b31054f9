"""What `lamina generate` and `lamina chat` print: streamed text, JSONL rows, logprobs.

    stream_request(llm, prompt, params)   text to stdout as it is generated; returns the final output
    output_row(row, output, logprobs)     one JSONL result line (with a `logprobs` list when asked)
    format_logprobs(completion, top)      a table, one line per generated token, for the terminal
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, TextIO

from lamina.outputs import CompletionOutput, Logprob, RequestOutput, token_text, top_entries
from lamina.sampling_params import RequestOutputKind, SamplingParams

if TYPE_CHECKING:  # the engine pulls in torch: import it only when a command runs
    from lamina.engine.input_processor import PromptType
    from lamina.llm import LLM


def stream_request(llm: LLM, prompt: PromptType, params: SamplingParams, out: TextIO) -> RequestOutput:
    """Run one request, writing its first sample's new text to `out` after every step, then a newline.
    The engine sends deltas (work linear in the length); the returned output holds the whole first sample."""
    engine = llm.engine
    request_id = engine.add_request(prompt, params.with_output_kind(RequestOutputKind.DELTA))
    pieces: list[str] = []
    token_ids: list[int] = []
    logprobs: list | None = None if params.logprobs is None else []
    last, final = None, None
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.request_id != request_id or not output.outputs or output.outputs[0].index != 0:
                continue
            last, final = output.outputs[0], output
            out.write(last.text)
            out.flush()
            pieces.append(last.text)
            token_ids.extend(last.token_ids)
            if logprobs is not None:
                logprobs.extend(last.logprobs or [])
    out.write("\n")
    out.flush()
    if final is None:
        return final
    whole = dataclasses.replace(last, text="".join(pieces), token_ids=token_ids, logprobs=logprobs)
    return dataclasses.replace(final, outputs=[whole])


def _finite(value: float) -> float | None:
    """A logprob JSON can carry: -inf becomes None (JSON has no infinity)."""
    return value if math.isfinite(value) else None


def _token(token_id: int, logprob: Logprob) -> dict:
    return {"token": logprob.decoded_token, "token_id": token_id, "logprob": _finite(logprob.logprob)}


def logprobs_json(completion: CompletionOutput, num_top: int) -> list[dict]:
    """Per generated token: the token, its id and logprob, and the top `num_top` alternatives."""
    rows = []
    for token_id, entry in zip(completion.token_ids, completion.logprobs or []):
        row = _token(token_id, entry[token_id]) if token_id in entry else {"token": None, "token_id": token_id,
                                                                          "logprob": None}
        row["top_logprobs"] = [_token(tid, lp) for tid, lp in top_entries(entry, num_top)]
        rows.append(row)
    return rows


def _sample_json(completion: CompletionOutput, num_top: int | None) -> dict:
    sample = {"text": completion.text, "token_ids": completion.token_ids, "finish_reason": completion.finish_reason,
              "stop_reason": completion.stop_reason}
    if num_top is not None:
        sample["logprobs"] = logprobs_json(completion, num_top)
    return sample


def output_row(row: dict, output: RequestOutput, num_top: int | None) -> dict:
    """The input row plus the result: text, token ids, finish reason (and logprobs when `num_top` is set);
    every sample under `samples` when there are several."""
    samples = [_sample_json(c, num_top) for c in output.outputs]
    result = {**row, "prompt_token_ids": output.prompt_token_ids, **samples[0]}
    if len(samples) > 1:
        result["samples"] = samples
    return result


def format_logprobs(completion: CompletionOutput, num_top: int) -> str:
    """A table for the terminal: each generated token, its logprob and the top alternatives.

         #  token           logprob  top 2
         0  'def'            -0.031  'def' -0.031  'class' -3.770
    """
    width = max([len(repr(token_text(lp, tid))) for e in completion.logprobs or [] for tid, lp in e.items()] + [5])
    lines = [f"{'#':>4}  {'token':<{width}}  {'logprob':>8}  top {num_top}"]
    for index, (token_id, entry) in enumerate(zip(completion.token_ids, completion.logprobs or [])):
        chosen = entry.get(token_id)
        logprob = f"{chosen.logprob:8.3f}" if chosen is not None else f"{'?':>8}"
        top = "  ".join(f"{token_text(lp, tid)!r} {lp.logprob:.3f}" for tid, lp in top_entries(entry, num_top))
        lines.append(f"{index:>4}  {token_text(chosen, token_id)!r:<{width}}  {logprob}  {top}".rstrip())
    return "\n".join(lines)
