"""The n-gram engine tests' common case: a tiny model, a prompt that repeats itself (so n-gram drafts are found and
accepted), and the greedy output of the engine without speculation to compare with."""
from __future__ import annotations

from pathlib import Path

from lamina import LLM, SamplingParams
from tests.helpers.tiny_models import make_tiny_model

REPEATING = [{"prompt_token_ids": [5, 6, 7, 5, 6, 7, 5, 6]}]
NGRAM_K3 = {"method": "ngram", "num_speculative_tokens": 3}


def tiny_llm(model: Path, **kwargs) -> LLM:
    """An engine over the tiny model (no tokenizer, 64 KV blocks)."""
    return LLM(model=str(model), skip_tokenizer_init=True, num_kv_blocks=64, **kwargs)


def greedy_reference(tmp_path: Path, max_tokens: int) -> tuple[Path, SamplingParams, list]:
    """A tiny llama, greedy parameters of `max_tokens` tokens, and its outputs on REPEATING without speculation."""
    model = make_tiny_model("llama", tmp_path / "m", vocab_size=320)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return model, params, tiny_llm(model).generate(REPEATING, params, use_tqdm=False)
