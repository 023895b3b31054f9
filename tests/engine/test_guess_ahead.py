"""Steps launched on a guess (n-gram, guess_ahead, greedy requests): while a step verifies drafts, the next one is
launched on the guess that all are accepted and the lookup's next token follows. Outputs are those of the engine
without guesses, with guesses that hold and guesses that fail, one request at a time or batched, stops and
max_tokens inside a guessed run; no KV block leaks; a request whose guesses keep failing stops guessing
(GuessRate); sampled requests make none."""
from __future__ import annotations

import pytest

from lamina import DEMO_MODEL, LLM, SamplingParams
from lamina.config import EngineConfig, ModelConfig, SpeculativeConfig
from lamina.engine.drafts import SpecDecodeStats
from lamina.engine.request import Request
from lamina.engine.spec_pacing import GUESS_MIN_HELD, MAX_REST, GuessRate
from lamina.engine.speculator import Speculator
from lamina.step import SchedulerOutput
from tests.helpers.tiny_models import make_tiny_model
from tests.helpers.tiny_tokenizer import save_tiny_tokenizer


# The demo model repeats itself (its greedy guesses mostly hold); a tiny random model rarely does (batched, its two
# requests' guesses hold for one and fail for the other in the same step).
PROMPTS = ["def fibonacci(n):\n", "The history of the city", "for i in range(10):\n", "class Stack:\n"]
TINY_PROMPTS = ["def f(x): return x + 1\ndef f(x): return", "a = [1, 2, 3, 1, 2, 3, 1, 2"]
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "adaptive": False}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    path = make_tiny_model("qwen3", tmp_path_factory.mktemp("guess"), vocab_size=320)
    save_tiny_tokenizer(path, vocab_size=300)
    return str(path)


def generate(model: str, prompts: list[str], params: list[SamplingParams], guess: bool | None,
             one_at_a_time: bool = True) -> tuple:
    """Outputs (tokens, text, finish and stop reason) of every prompt, the engine's speculative stats and step
    kinds; guess None: no speculation."""
    spec = None if guess is None else {**SPEC, "guess_ahead": guess}
    llm = LLM(model=model, speculative_config=spec, block_size=4, num_kv_blocks=300, max_model_len=160)
    llm.engine.step_log = []
    if one_at_a_time:
        outputs = [llm.generate([p], q, use_tqdm=False)[0] for p, q in zip(prompts, params)]
    else:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    llm.engine.check_integrity()
    texts = [[(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in o.outputs] for o in outputs]
    return texts, llm.engine.get_stats().spec, [s.kind for s in llm.engine.step_log]


def assert_same_outputs(model: str, prompts: list[str], params: list[SamplingParams], one_at_a_time: bool = True):
    """With guesses, without them and without speculation: the same outputs; returns the guessing engine's stats."""
    guessed, spec, kinds = generate(model, prompts, params, True, one_at_a_time)
    assert guessed == generate(model, prompts, params, False, one_at_a_time)[0]
    assert guessed == generate(model, prompts, params, None, one_at_a_time)[0]
    assert spec.guessed_rows > 0 and "verify ahead" in kinds
    return spec


def test_outputs_equal_the_engine_without_guesses() -> None:
    """Greedy requests one at a time: some guesses held (their steps' tokens were kept) and some failed (their steps
    were void); a sampled request makes none."""
    params = [SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)] * 4
    spec = assert_same_outputs(DEMO_MODEL, PROMPTS, params)
    assert spec.guessed_rows > spec.guessed_rows_held > 0
    sampled = [SamplingParams(temperature=0.8, max_tokens=60, ignore_eos=True, seed=i) for i in range(4)]
    outputs, spec, _ = generate(DEMO_MODEL, PROMPTS, sampled, True)
    assert spec.guessed_rows == 0 and spec.num_accepted_tokens > 0
    assert outputs == generate(DEMO_MODEL, PROMPTS, sampled, None)[0]


def test_a_batch_keeps_the_rows_whose_guess_held(tiny_model: str) -> None:
    """Batched, a step is launched on guesses only when every request has one; the rows whose guess failed are
    void while the others' tokens are kept (the requests then go on from the tokens read)."""
    params = [SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)] * 2
    spec = assert_same_outputs(tiny_model, TINY_PROMPTS, params, one_at_a_time=False)
    assert spec.guessed_rows > spec.guessed_rows_held > 0


def test_stops_and_max_tokens_inside_a_guessed_run() -> None:
    """Stop ids, stop strings and max_tokens falling among the tokens of steps launched on guesses end the request
    there, as without speculation."""
    greedy = [SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)] * 4
    plain = generate(DEMO_MODEL, PROMPTS, greedy, None)[0]
    params = []
    for i, outputs in enumerate(plain):
        tokens, text = outputs[0][0], outputs[0][1]
        if i % 3 == 0:
            params.append(SamplingParams(temperature=0, max_tokens=60, stop_token_ids=[tokens[25]]))
        elif i % 3 == 1:
            params.append(SamplingParams(temperature=0, max_tokens=60, stop=[text[30:33]], ignore_eos=True))
        else:
            params.append(SamplingParams(temperature=0, max_tokens=29, ignore_eos=True))
    assert assert_same_outputs(DEMO_MODEL, PROMPTS, params).guessed_rows_held > 0


def test_a_request_whose_guesses_fail_stops_guessing_and_probes_less_often() -> None:
    rate, pattern = GuessRate(), []
    for _ in range(40):
        wants = rate.wants()
        pattern.append("g" if wants else ".")
        if wants:
            rate.observe(False)
    text = "".join(pattern)
    assert text.startswith("g.g...g.......g") and max(map(len, text.split("g"))) <= MAX_REST - 1
    for _ in range(4):
        rate.observe(True)  # probes that hold: guessing resumes
    assert rate.held >= GUESS_MIN_HELD and rate.wants() and rate.every == 1


def continuations_of(temperature: float, guess_ahead: bool = True) -> dict[str, list[int]]:
    """A request whose tokens repeat [1 2 3 4 5] and whose step in flight verifies the drafts [3, 4]: the guesser
    reads [... 1 2] + [3 4] and continues the repeat: 5 (the guessed token after the drafts), then drafts 1, 2."""
    config = SpeculativeConfig(method="ngram", num_speculative_tokens=2, prompt_lookup_max=3, adaptive=False,
                               guess_ahead=guess_ahead)
    speculator = Speculator(config, 1024, SpecDecodeStats())
    request = Request("r", [1, 2, 3, 4, 5] * 3 + [1], SamplingParams(temperature=temperature, max_tokens=50))
    request.append_output_token_ids([2])
    request.num_computed_tokens = request.num_tokens - 1
    scheduled = SchedulerOutput(req_ids=["r"], num_scheduled_tokens={"r": 3},
                                scheduled_spec_decode_tokens={"r": [3, 4]})
    return speculator.continuations(scheduled, [request])


def test_continuations_guess_the_token_after_the_drafts_for_greedy_requests() -> None:
    assert continuations_of(0.0) == {"r": [5, 1, 2]}
    assert continuations_of(0.7) == {}  # a sampled request makes no guess
    assert continuations_of(0.0, guess_ahead=False) == {}


def test_guess_ahead_is_for_ngram_only() -> None:
    with pytest.raises(ValueError, match="guess_ahead"):
        SpeculativeConfig(method="early_exit", guess_ahead=True)
    with pytest.raises(ValueError, match="guess_ahead"):
        SpeculativeConfig(method="ngram", guess_ahead="yes")
    assert SpeculativeConfig(method="early_exit").guess_ahead is False  # off by default
    with pytest.raises(ValueError, match="guess_ahead.*async_scheduling"):
        EngineConfig(ModelConfig(model="m"), async_scheduling=False,
                     speculative_config={"method": "ngram", "guess_ahead": True})
