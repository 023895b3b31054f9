"""/v1/completions with echo + logprobs: the prompt's logprobs (the engine's prompt_logprobs) before the
completion's, in OpenAI's legacy shape; max_tokens 0 with echo scores the prompt only (what
lm-evaluation-harness's local-completions model sends for loglikelihood), streamed and not."""
from __future__ import annotations

import openai
import pytest

from lamina import LLM, SamplingParams
from tests.server.harness import MODEL_NAME

PROMPT = "def add(a, b):"


def _offline(offline: LLM, prompt: str | dict, max_tokens: int = 3) -> object:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, logprobs=2, prompt_logprobs=2, ignore_eos=True)
    return offline.generate(prompt, params, use_tqdm=False)[0]


def _expected(out) -> list[float | None]:
    prompt = [None] + [entry[t].logprob for entry, t in zip(out.prompt_logprobs[1:], out.prompt_token_ids[1:])]
    completion = out.outputs[0]
    return prompt + [entry[t].logprob for entry, t in zip(completion.logprobs, completion.token_ids)]


def _close(got: list[float | None], expected: list[float | None]) -> bool:
    return len(got) == len(expected) and all(
        (a is None and b is None) or (a is not None and b is not None and abs(a - b) < 1e-4)
        for a, b in zip(got, expected))


def test_echo_logprobs_cover_prompt_and_completion(client: openai.OpenAI, offline: LLM) -> None:
    out = _offline(offline, PROMPT)
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=3, temperature=0, logprobs=2,
                                  echo=True, extra_body={"ignore_eos": True})
    choice, num_prompt = r.choices[0], len(out.prompt_token_ids)
    assert choice.text == PROMPT + out.outputs[0].text
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.text_offset) == len(lp.top_logprobs) == num_prompt + 3
    assert _close(lp.token_logprobs, _expected(out))
    assert lp.top_logprobs[0] is None and all(1 <= len(top) <= 3 for top in lp.top_logprobs[1:])
    assert lp.text_offset[0] == 0
    assert all(b - a == len(t) for a, b, t in zip(lp.text_offset, lp.text_offset[1:], lp.tokens))
    assert r.usage.completion_tokens == 3


def test_echo_with_max_tokens_zero_scores_the_prompt_only(client: openai.OpenAI, offline: LLM) -> None:
    """lm-eval's loglikelihood request: token-id prompts in a batch, echo, logprobs 1, max_tokens 0."""
    prompts = [[5, 6, 7, 8, 9], [40, 41, 42]]
    r = client.completions.create(model=MODEL_NAME, prompt=prompts, max_tokens=0, temperature=0, logprobs=1,
                                  echo=True)
    assert len(r.choices) == 2 and r.usage.completion_tokens == 0
    for choice, ids in zip(sorted(r.choices, key=lambda c: c.index), prompts):
        out = _offline(offline, {"prompt_token_ids": ids}, max_tokens=1)
        assert len(choice.logprobs.tokens) == len(ids) and choice.finish_reason == "length"
        assert _close(choice.logprobs.token_logprobs, _expected(out)[:len(ids)])
        assert choice.text == offline.get_tokenizer().decode(ids)
        greedy = [t == max(top.values()) for t, top in zip(choice.logprobs.token_logprobs[1:],
                                                           choice.logprobs.top_logprobs[1:])]
        assert len(greedy) == len(ids) - 1  # what lm-eval's is_greedy reads


def test_streamed_echo_equals_the_response(client: openai.OpenAI) -> None:
    for max_tokens in (0, 4):
        kwargs = dict(model=MODEL_NAME, prompt=PROMPT, max_tokens=max_tokens, temperature=0, logprobs=1, echo=True,
                      extra_body={"ignore_eos": True})
        whole = client.completions.create(**kwargs).choices[0]
        text, tokens, token_logprobs, offsets = "", [], [], []
        for chunk in client.completions.create(stream=True, **kwargs):
            for c in chunk.choices:
                text += c.text
                if c.logprobs is not None:
                    tokens += c.logprobs.tokens
                    token_logprobs += c.logprobs.token_logprobs
                    offsets += c.logprobs.text_offset
        assert text == whole.text and tokens == whole.logprobs.tokens
        assert token_logprobs == whole.logprobs.token_logprobs and offsets == whole.logprobs.text_offset


@pytest.mark.parametrize("body, field", [({"max_tokens": 0}, "max_tokens"),
                                         ({"echo": True, "logprobs": 21}, "logprobs"),
                                         ({"echo": True, "logprobs": -1}, "logprobs")])
def test_bad_values_are_400_naming_the_field(client: openai.OpenAI, body: dict, field: str) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=MODEL_NAME, prompt=PROMPT, **body)
    assert field in str(bad.value)
