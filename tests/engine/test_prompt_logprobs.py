"""SamplingParams.prompt_logprobs: every prompt token's logprob and the top-N at each position equal HF
transformers' (fp32, no cache), unchunked, with chunked prefill forced, with the prefix cache warm (the request
must recompute its prompt), with preemption forced, inside a mixed batch and for n > 1."""
from __future__ import annotations

import random

import pytest
import torch

from lamina import LLM, SamplingParams
from lamina.sampling_params import RequestOutputKind
from tests.helpers.hf_oracle import hf_logprobs, load_hf
from tests.helpers.tiny_models import make_tiny_model

TOP = 3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = make_tiny_model("qwen2", tmp_path_factory.mktemp("qwen2"))
    model = load_hf(str(path))
    rng = random.Random(5)
    prompts = [[rng.randrange(model.config.vocab_size) for _ in range(n)] for n in (19, 7, 30)]
    return str(path), prompts, [hf_logprobs(model, p) for p in prompts]


def _run(llm: LLM, prompts: list[list[int]], **params) -> list:
    params = SamplingParams(**{"temperature": 0, "max_tokens": 3, "ignore_eos": True, "prompt_logprobs": TOP,
                               **params})
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    llm.engine.check_integrity()
    assert not llm.engine.has_unfinished_requests()
    return outs


def _check(output, prompt: list[int], expected: torch.Tensor) -> None:
    got = output.prompt_logprobs
    assert got is not None and len(got) == len(prompt) and got[0] is None
    for i in range(1, len(prompt)):
        entry, row = got[i], expected[i - 1]
        assert entry[prompt[i]].logprob == pytest.approx(row[prompt[i]].item(), abs=1e-4)
        assert entry[prompt[i]].rank == int((row > row[prompt[i]]).sum()) + 1
        top = row.topk(TOP)
        ranked = sorted((lp.rank, tid) for tid, lp in entry.items() if lp.rank <= TOP)
        assert [tid for _, tid in ranked] == top.indices.tolist()
        assert len(entry) in (TOP, TOP + 1)  # the prompt token joins the top-N when it is not in it


def _check_all(outs, prompts, expected) -> None:
    for out, prompt, exp in zip(outs, prompts, expected):
        _check(out, prompt, exp)


def test_matches_hf(tiny):
    path, prompts, expected = tiny
    llm = LLM(model=path, skip_tokenizer_init=True, block_size=4, num_kv_blocks=128)
    _check_all(_run(llm, prompts), prompts, expected)


def test_matches_hf_with_chunked_prefill(tiny):
    path, prompts, expected = tiny
    llm = LLM(model=path, skip_tokenizer_init=True, block_size=4, num_kv_blocks=128, max_num_batched_tokens=5)
    _check_all(_run(llm, prompts), prompts, expected)
    assert llm.engine.get_stats().num_steps > 30 // 5  # the prompts really were chunked


def test_prefix_cache_is_skipped(tiny):
    path, prompts, expected = tiny
    llm = LLM(model=path, skip_tokenizer_init=True, block_size=4, num_kv_blocks=128, enable_prefix_caching=True)
    warm = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=2), use_tqdm=False)
    assert all(o.prompt_logprobs is None for o in warm)
    outs = _run(llm, prompts)
    _check_all(outs, prompts, expected)
    assert all(o.num_cached_tokens == 0 for o in outs)  # the warm cache was not used
    again = llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(max_tokens=2), use_tqdm=False)
    assert again[0].num_cached_tokens > 0  # ... and other requests still use it
    llm.engine.check_integrity()


def test_with_preemption(tiny):
    path, prompts, expected = tiny
    llm = LLM(model=path, skip_tokenizer_init=True, block_size=4, num_kv_blocks=16, max_model_len=40,
              enable_prefix_caching=True)
    outs = _run(llm, prompts * 2, max_tokens=8)
    _check_all(outs, prompts * 2, expected * 2)
    assert llm.engine.get_stats().num_preemptions > 0


def test_n_samples_and_delta(tiny):
    path, prompts, expected = tiny
    llm = LLM(model=path, skip_tokenizer_init=True, block_size=4, num_kv_blocks=128)
    outs = _run(llm, prompts[:1], n=3, temperature=1.0, seed=1)
    _check(outs[0], prompts[0], expected[0])
    params = SamplingParams(max_tokens=4, prompt_logprobs=0, output_kind=RequestOutputKind.DELTA, ignore_eos=True)
    llm.engine.add_request({"prompt_token_ids": prompts[1]}, params)
    seen = []
    while llm.engine.has_unfinished_requests():
        seen += [o.prompt_logprobs for o in llm.engine.step()]
    assert sum(p is not None for p in seen) == 1  # DELTA: once
    first = next(p for p in seen if p is not None)
    assert [len(e) if e else 0 for e in first] == [0] + [1] * (len(prompts[1]) - 1)
    llm.engine.check_integrity()


def test_decoded_tokens_and_limits():
    llm = LLM(model="lamina/assets/demo-model", num_kv_blocks=64, max_logprobs=5)
    out = llm.generate("def add(a, b):", SamplingParams(max_tokens=1, prompt_logprobs=2), use_tqdm=False)[0]
    tokens = out.prompt_token_ids
    texts = [out.prompt_logprobs[i][t].decoded_token for i, t in enumerate(tokens) if i]
    assert "".join(texts) == llm.get_tokenizer().decode(tokens[1:])
    with pytest.raises(ValueError, match="prompt_logprobs: 6 is above the limit of 5"):
        llm.generate("x", SamplingParams(prompt_logprobs=6), use_tqdm=False)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="prompt_logprobs must be None or an integer >= 0"):
            SamplingParams(prompt_logprobs=bad)
    llm.engine.check_integrity()
