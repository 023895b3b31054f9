"""The engine's side of speculative decoding: the pause of the policy's decisions while nobody drafts."""
from __future__ import annotations

from lamina import LLM, SamplingParams
from lamina.engine.speculator import MAX_REST, Rest
from tests.helpers.tiny_models import make_tiny_model


def test_rest_doubles_while_nobody_drafts_and_resets_on_drafts() -> None:
    rest, pattern = Rest(), []
    for _ in range(40):
        if rest.resting():
            pattern.append(".")
            continue
        pattern.append("d")
        rest.decided(False)
    assert "".join(pattern).startswith("d.d..d....d........d")  # pauses of 1, 2, 4, 8, 16 steps
    assert max(map(len, "".join(pattern).split("d"))) <= MAX_REST
    rest.left = 0
    rest.decided(True)
    assert (rest.left, rest.length) == (0, 1)


def test_an_engine_whose_drafts_do_not_pay_rarely_decides(tmp_path) -> None:
    """On a CPU a verify step costs about what its tokens cost, so the adaptive policy keeps speculation off;
    it is then asked on a few of the steps only (MAX_REST pauses), and greedy output is unchanged."""
    model = make_tiny_model("llama", tmp_path / "m", vocab_size=320)
    params = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
    prompts = [{"prompt_token_ids": [5, 6, 7, 5, 6, 7, 5, 6]}]
    want = LLM(model=str(model), skip_tokenizer_init=True, num_kv_blocks=64).generate(prompts, params, use_tqdm=False)
    llm = LLM(model=str(model), skip_tokenizer_init=True, num_kv_blocks=64,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    got = llm.generate(prompts, params, use_tqdm=False)
    assert got[0].outputs[0].token_ids == want[0].outputs[0].token_ids
    stats = llm.engine.get_stats()
    assert stats.spec.policy_off_steps > 0 and stats.spec.policy_steps < stats.num_steps / 3
    llm.engine.check_integrity()


def test_a_worker_side_proposer_is_asked_again_after_each_pause(tmp_path) -> None:
    """Steps launched ahead during a pause skip before_step; the pause still ends (every processed step counts)
    and the next step waits for its tokens, so the policy decides again: a regression where an ahead chain
    never ended and a draft model was never asked again."""
    model = make_tiny_model("llama", tmp_path / "m", vocab_size=320)
    params = SamplingParams(temperature=0, max_tokens=150, ignore_eos=True)
    prompts = [{"prompt_token_ids": [5, 6, 7, 8]}]
    want = LLM(model=str(model), skip_tokenizer_init=True, num_kv_blocks=64).generate(prompts, params, use_tqdm=False)
    llm = LLM(model=str(model), skip_tokenizer_init=True, num_kv_blocks=64,
              speculative_config={"method": "draft_model", "model": str(model), "num_speculative_tokens": 2})
    llm.engine.step_log = []
    got = llm.generate(prompts, params, use_tqdm=False)
    assert got[0].outputs[0].token_ids == want[0].outputs[0].token_ids
    kinds = [step.kind for step in llm.engine.step_log]
    assert "decode ahead" in kinds and kinds.count("decode") + kinds.count("verify") >= 4  # paused, then asked
    llm.engine.check_integrity()
