"""RequestOutputKind: CUMULATIVE, DELTA and FINAL_ONLY outputs of the same request carry the same result;
a long DELTA stream carries (and copies) each token once."""
from __future__ import annotations

import statistics
import tracemalloc

import pytest

from lamina import LLM, RequestOutputKind, SamplingParams
from lamina.engine.output_processor import OutputProcessor
from lamina.engine.request import Request
from lamina.loader.tokenizer import Tokenizer
from lamina.outputs import CompletionOutput, Logprob, RequestOutput
from tests.helpers.tiny_models import make_tiny_model
from tests.helpers.tiny_tokenizer import TEXT, save_tiny_tokenizer

CUMULATIVE, DELTA, FINAL_ONLY = RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY
LONG = 4096
PROMPT = "for i in range(10):"


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    path = make_tiny_model("llama", tmp_path_factory.mktemp("kinds"), vocab_size=320, num_hidden_layers=1,
                           max_position_embeddings=LONG + 64)
    save_tiny_tokenizer(path, vocab_size=300)
    return LLM(model=str(path), block_size=16, num_kv_blocks=(LONG + 64) // 16 + 8, max_model_len=LONG + 64,
               max_num_batched_tokens=64)


def run(llm: LLM, params: SamplingParams, request_id: str) -> list[RequestOutput]:
    """Every output of one request, stepping the engine to the end."""
    engine = llm.engine
    engine.add_request(PROMPT, params, request_id=request_id)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += [o for o in engine.step() if o.request_id == request_id]
    engine.check_integrity()
    return outputs


def concatenate(deltas: list[RequestOutput]) -> list[CompletionOutput]:
    """DELTA outputs joined per sample; each sample's finish_reason must come once, in its last delta."""
    joined: dict[int, CompletionOutput] = {}
    for output in deltas:
        for delta in output.outputs:
            done = joined.setdefault(delta.index, CompletionOutput(delta.index, "", []))
            assert done.finish_reason is None, "a sample appeared again after its finish was reported"
            done.text += delta.text
            done.token_ids += delta.token_ids
            if delta.logprobs is not None:
                done.logprobs = (done.logprobs or []) + delta.logprobs
            done.cumulative_logprob, done.finish_reason = delta.cumulative_logprob, delta.finish_reason
            done.stop_reason = delta.stop_reason
    return [joined[i] for i in sorted(joined)]


def stop_string_of(llm: LLM, params: SamplingParams) -> str:
    """Three characters from the middle of sample 0's text, so a run with this stop string stops there."""
    text = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0].text
    assert len(text) > 12
    return text[len(text) // 2:len(text) // 2 + 3]


@pytest.mark.parametrize("n", [1, 2])
def test_delta_outputs_concatenate_to_the_cumulative_result(llm: LLM, n: int) -> None:
    base = dict(n=n, temperature=0 if n == 1 else 0.9, seed=7, max_tokens=40, ignore_eos=True, logprobs=2)
    stop = stop_string_of(llm, SamplingParams(**base))
    params = SamplingParams(**base, stop=[stop])
    cumulative = run(llm, params, f"cumulative-{n}")
    deltas = run(llm, params.with_output_kind(DELTA), f"delta-{n}")
    final = run(llm, params.with_output_kind(FINAL_ONLY), f"final-{n}")

    expected = cumulative[-1].outputs
    assert expected[0].finish_reason == "stop" and expected[0].stop_reason == stop
    assert len(final) == 1 and final[0].finished and final[0].outputs == expected
    assert concatenate(deltas) == expected
    assert [o.finished for o in deltas] == [False] * (len(deltas) - 1) + [True]
    # the stream never shows text that the stop string cuts later
    streamed = {i: "" for i in range(n)}
    for output in deltas:
        for delta in output.outputs:
            streamed[delta.index] += delta.text
            assert expected[delta.index].text.startswith(streamed[delta.index])
    assert stop not in expected[0].text and all(d.outputs for d in deltas)


def test_an_aborted_delta_stream_ends_with_the_held_back_text(llm: LLM) -> None:
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True, stop=["@" * 9])  # never found
    engine.add_request(PROMPT, params, request_id="whole")
    engine.add_request(PROMPT, params.with_output_kind(DELTA), request_id="parts")
    deltas = []
    for _ in range(12):
        deltas += [o for o in engine.step() if o.request_id == "parts"]
    whole = engine.abort_request("whole")
    deltas.append(engine.abort_request("parts"))
    assert whole.finished and deltas[-1].finished and deltas[-1].outputs[0].finish_reason == "abort"
    assert concatenate(deltas) == whole.outputs and len(whole.outputs[0].text) > 8
    assert deltas[-1].outputs[0].text  # the look-back a stop string could have cut, released at the end
    assert not engine.has_unfinished_requests()
    engine.check_integrity()


def test_generate_returns_final_outputs_whatever_kind_the_params_ask(llm: LLM) -> None:
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, output_kind=DELTA)
    outputs = llm.generate([PROMPT, PROMPT], params, use_tqdm=False)
    assert params.output_kind is DELTA  # the caller's object is not changed
    reference = run(llm, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), "reference")[-1]
    assert all(o.finished and o.outputs == reference.outputs for o in outputs)
    assert len(outputs[0].outputs[0].token_ids) == 12
    llm.engine.check_integrity()


def test_output_kind_is_validated() -> None:
    with pytest.raises(ValueError, match="output_kind"):
        SamplingParams(output_kind="delta")
    params = SamplingParams(max_tokens=3)
    assert params.output_kind is CUMULATIVE and params.with_output_kind(CUMULATIVE) is params
    copy = params.with_output_kind(FINAL_ONLY)
    assert copy.output_kind is FINAL_ONLY and copy.max_tokens == 3 and params.output_kind is CUMULATIVE


class CountingList(list):
    """A list that counts the elements anyone reads out of it (slices and iteration): copies."""

    def __init__(self) -> None:
        super().__init__()
        self.num_read = 0

    def __getitem__(self, index: int | slice) -> object:
        item = super().__getitem__(index)
        self.num_read += len(item) if isinstance(index, slice) else 1
        return item

    def __iter__(self):  # noqa: ANN204 - list's own signature
        self.num_read += len(self)
        return super().__iter__()


def test_a_4096_token_delta_stream_does_linear_work(llm: LLM) -> None:
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=LONG, ignore_eos=True, logprobs=1, stop=["@" * 6],
                            output_kind=DELTA)
    engine.add_request(PROMPT, params, request_id="long")
    request = engine.scheduler.requests["long"]
    request.output_token_ids, request.logprobs = CountingList(), CountingList()
    counts = dict(outputs=0, token_ids=0, logprobs=0, chars=0)
    texts = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            delta = output.outputs[0]
            texts.append(delta.text)
            counts["outputs"] += 1
            counts["token_ids"] += len(delta.token_ids)
            counts["logprobs"] += len(delta.logprobs)
            counts["chars"] += len(delta.text)
    engine.check_integrity()
    num_read = request.output_token_ids.num_read, request.logprobs.num_read

    assert output.finished and delta.finish_reason == "length"
    text = "".join(texts)
    assert len(request.output_token_ids) == LONG and text == engine.tokenizer.decode(request.output_token_ids)
    # Every token, logprob and character is carried once: 4,096 in all, not ~4096^2 / 2 = 8.4M.
    assert counts == dict(outputs=LONG, token_ids=LONG, logprobs=LONG, chars=len(text))
    # ... and read out of the request's lists once (detokenizing, then the delta): linear, not quadratic.
    assert max(num_read) <= 2 * LONG


def step_allocations(tokenizer: Tokenizer, kind: RequestOutputKind) -> list[int]:
    """Bytes allocated at the peak of each OutputProcessor step (tracemalloc) for a fake request that
    gains one token (and its logprob) per step, LONG steps: a step's allocations are the work it copies."""
    ids = tokenizer.encode("".join(TEXT), add_special_tokens=False)
    processor = OutputProcessor(tokenizer)
    request = Request("r", ids[:3], SamplingParams(max_tokens=LONG, logprobs=0, stop=["@" * 6], output_kind=kind))
    processor.add_group("r", [request])
    peaks = []
    tracemalloc.start()
    try:
        for i in range(LONG):
            token = ids[i % len(ids)]
            request.append_output_token_ids([token])
            request.logprobs.append({token: Logprob(-1.0, 1)})
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            outputs = processor.process([request], lambda r, stop: None)
            peaks.append(tracemalloc.get_traced_memory()[1] - before)
            del outputs
    finally:
        tracemalloc.stop()
    return peaks


def test_output_work_per_step_does_not_grow_with_the_length_unless_cumulative(llm: LLM) -> None:
    """The text side too (the detokenizer once grew one str per token: ~n bytes copied per step)."""
    per_step = {kind: step_allocations(llm.get_tokenizer(), kind) for kind in RequestOutputKind}
    early, late = ({kind: statistics.median(p[part]) for kind, p in per_step.items()}
                   for part in (slice(0, 512), slice(-512, None)))
    assert late[DELTA] <= early[DELTA] + 256 and late[FINAL_ONLY] <= early[FINAL_ONLY] + 256
    assert late[CUMULATIVE] > 5 * early[CUMULATIVE]  # the measure does see the copies when they are made
