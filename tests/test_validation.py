"""Issue 10, reproducer 5 in the Python API, and property tests: every input to SamplingParams and to the
server's request models either validates or raises ValueError (a 400) naming a field, never anything else."""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from lamina import LLM, SamplingParams
from lamina.sampling_params import wrap_seed
from lamina.server import errors
from lamina.server.protocol import ChatCompletionRequest, CompletionRequest
from tests.helpers.tiny_models import make_tiny_model
from tests.helpers.tiny_tokenizer import save_tiny_tokenizer

SAMPLING_FIELDS = [f for f, spec in SamplingParams.__dataclass_fields__.items() if spec.init]


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    path = make_tiny_model("llama", tmp_path_factory.mktemp("validation"), vocab_size=320)
    save_tiny_tokenizer(path, vocab_size=300)
    return LLM(model=str(path), block_size=4, num_kv_blocks=64, max_model_len=64)


@pytest.mark.parametrize(("kwargs", "field"), [
    (dict(temperature=math.inf), "temperature"), (dict(temperature=math.nan), "temperature"),
    (dict(temperature=1e308), "temperature"), (dict(repetition_penalty=math.inf), "repetition_penalty"),
    (dict(repetition_penalty=1e-300), "repetition_penalty"), (dict(top_k=2**63), "top_k"),
    (dict(top_p=math.nan), "top_p"), (dict(min_p=math.inf), "min_p"), (dict(n=10**9), "n"), (dict(n=True), "n"),
    (dict(seed=2**63), "seed"), (dict(seed=-(2**63) - 1), "seed"), (dict(max_tokens=2**31), "max_tokens"),
    (dict(max_tokens=10**5000), "max_tokens"), (dict(min_tokens=2**40, max_tokens=None), "min_tokens"),
    (dict(stop="\ud800"), "stop"), (dict(stop=["a"] * 65), "stop"), (dict(stop_token_ids=[2**40]), "stop_token_ids"),
    (dict(ignore_eos="yes"), "ignore_eos"), (dict(logprobs=True), "logprobs"),
])
def test_absurd_values_are_refused_by_name(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}[ :]"):
        SamplingParams(**kwargs)


def test_the_bounds_themselves_are_accepted() -> None:
    SamplingParams(temperature=100, repetition_penalty=0.01, top_k=2**31 - 1, seed=-(2**63), n=1024,
                   max_tokens=2**31 - 1, min_tokens=2**31 - 1, stop_token_ids=[2**31 - 1])
    SamplingParams(repetition_penalty=100, seed=2**63 - 1, top_k=-1)


def test_sample_seeds_wrap_within_int64() -> None:
    params = SamplingParams(seed=2**63 - 1, n=3)
    assert [params.clone_for_sample(i).seed for i in range(3)] == [2**63 - 1, -(2**63), -(2**63) + 1]
    assert wrap_seed(5) == 5 and wrap_seed(-5) == -5


def test_max_tokens_past_the_context_is_an_error_not_a_cut(llm: LLM) -> None:
    """One rule for the API and the server: prompt + max_tokens <= max_model_len, else ValueError."""
    with pytest.raises(ValueError, match="^max_tokens "):
        llm.generate({"prompt_token_ids": [5] * 10}, SamplingParams(max_tokens=10**12))
    with pytest.raises(ValueError, match="max_tokens: .*max_model_len"):
        llm.generate({"prompt_token_ids": [5] * 10}, SamplingParams(max_tokens=10**6))
    with pytest.raises(ValueError, match="max_tokens: .*at most 54"):
        llm.generate({"prompt_token_ids": [5] * 10}, SamplingParams(max_tokens=55))
    out = llm.generate({"prompt_token_ids": [5] * 10}, SamplingParams(max_tokens=54, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 54
    llm.engine.check_integrity()


@pytest.mark.parametrize("prompt", ["\ud800", "ok \udfff", {"prompt": "a\ud83d"}])
def test_a_lone_surrogate_in_a_prompt_is_a_value_error(llm: LLM, prompt: object) -> None:
    with pytest.raises(ValueError, match="prompt: must be valid Unicode"):
        llm.generate(prompt, SamplingParams(max_tokens=2))
    llm.engine.check_integrity()


# ---- properties --------------------------------------------------------------------------------------

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5),
    st.sampled_from([0, 1, -1, 2**31, 2**63, 2**64, 1e-300, 0.5, 100.0, "", "\ud800", "1"]))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=3), inner, max_size=2), max_leaves=6)
_bounded = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


def _names_a_field(message: str, fields: object) -> bool:
    return any(message.startswith(f"{name} ") or message.startswith(f"{name}:") for name in fields)


@_bounded
@given(st.dictionaries(st.sampled_from(SAMPLING_FIELDS), _values, max_size=5))
def test_sampling_params_validate_or_name_a_field(kwargs: dict) -> None:
    try:
        SamplingParams(**kwargs)
    except ValueError as err:
        assert _names_a_field(str(err), SAMPLING_FIELDS), err


_COMPLETION_KEYS = sorted(set(CompletionRequest.model_fields) | {"user", "metadata", "guided_json"})
_CHAT_KEYS = sorted(set(ChatCompletionRequest.model_fields) | {"user", "metadata"})
_messages = st.lists(st.fixed_dictionaries({"role": _values, "content": _values}), max_size=2) | _values


def _check_request(model: type, body: dict) -> None:
    try:
        request = model.model_validate(body)
    except ValidationError as err:
        api_error = errors.from_pydantic_errors(err.errors(include_url=False))
        assert api_error.status == 400 and api_error.message
        return
    fields = set(model.model_fields)
    try:
        request.to_sampling_params()
        request.prompts() if model is CompletionRequest else request.template_messages()
    except ValueError as err:
        assert _names_a_field(str(err), fields), err


@_bounded
@given(st.dictionaries(st.sampled_from(_COMPLETION_KEYS), _values, max_size=6),
       st.one_of(st.text(max_size=4), st.lists(st.integers(-1, 400), max_size=3), _values))
def test_completion_requests_validate_or_name_a_field(body: dict, prompt: object) -> None:
    _check_request(CompletionRequest, {"prompt": prompt, **body})


@_bounded
@given(st.dictionaries(st.sampled_from(_CHAT_KEYS), _values, max_size=6), _messages)
def test_chat_requests_validate_or_name_a_field(body: dict, messages: object) -> None:
    _check_request(ChatCompletionRequest, {"messages": messages, **body})
