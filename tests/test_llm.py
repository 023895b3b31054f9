"""The public API end to end on a tiny random Llama with a real byte-level BPE tokenizer."""
from __future__ import annotations

import dataclasses
import gc
import json
import shutil
import weakref

import pytest
import torch

from lamina import LLM, SamplingParams, llm as llm_module
from lamina.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, engine_arg_names
from lamina.quant import fp8, rtn4
from lamina.quant.compressed_tensors import config_dict
from tests.helpers.hf_oracle import hf_greedy, hf_logprobs, load_hf
from tests.helpers.tiny_models import make_tiny_model
from tests.helpers.tiny_tokenizer import save_tiny_tokenizer

PROMPTS = ["def add(a, b):", "for i in range(10):", "class Point:", "日本語 🙂", "The quick brown fox"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = make_tiny_model("llama", tmp_path_factory.mktemp("llm"), vocab_size=320)
    save_tiny_tokenizer(path, vocab_size=300)
    return str(path)


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model=model_dir, block_size=4, num_kv_blocks=256, max_model_len=256)


def finish(llm: LLM) -> None:
    llm.engine.check_integrity()
    assert not llm.engine.has_unfinished_requests()


def test_text_prompts_greedy_match_hf_and_text_is_decoded(llm, model_dir):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    hf = load_hf(model_dir)
    tok = llm.get_tokenizer()
    for prompt, out in zip(PROMPTS, outs):
        assert out.prompt == prompt and out.prompt_token_ids == tok.encode(prompt)
        completion = out.outputs[0]
        assert completion.token_ids == hf_greedy(hf, out.prompt_token_ids, 12)
        assert completion.text == tok.decode(completion.token_ids)
        assert completion.finish_reason == "length"
        assert out.metrics.ttft is not None and out.metrics.finished_time >= out.metrics.first_token_time
    finish(llm)


def test_one_request_alone_equals_the_same_inside_a_big_batch(llm):
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    alone = llm.generate(PROMPTS[1], params, use_tqdm=False)[0].outputs[0].token_ids
    batch = llm.generate(PROMPTS * 6, params, use_tqdm=False)
    assert all(b.outputs[0].token_ids == alone for b in batch[1::5])
    finish(llm)


def test_seeded_sampling_does_not_depend_on_the_batch(llm):
    seeded = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=1234, ignore_eos=True)
    alone = llm.generate(PROMPTS[0], seeded, use_tqdm=False)[0].outputs[0].token_ids
    others = [SamplingParams(temperature=0.7, max_tokens=5 + i, ignore_eos=True, seed=i if i % 2 else None)
              for i in range(4)]
    batch = llm.generate(PROMPTS[1:] + PROMPTS[:1], others + [seeded], use_tqdm=False)
    assert batch[-1].outputs[0].token_ids == alone
    other_seed = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=4321, ignore_eos=True)
    assert llm.generate(PROMPTS[0], other_seed, use_tqdm=False)[0].outputs[0].token_ids != alone
    finish(llm)


def test_parallel_samples_share_the_prompt_and_differ(llm):
    prompt = "class Point:\n    def __init__(self, x, y):"
    out = llm.generate(prompt, SamplingParams(n=4, temperature=1.0, max_tokens=10, seed=7, ignore_eos=True),
                       use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert all(len(c.token_ids) == 10 and c.finish_reason == "length" for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    assert llm.engine.get_stats().prefix_cache_hits > 0
    finish(llm)


def test_logprobs_are_the_models_distribution(llm, model_dir):
    out = llm.generate(PROMPTS[2], SamplingParams(temperature=0, max_tokens=5, logprobs=3, ignore_eos=True),
                       use_tqdm=False)[0]
    completion = out.outputs[0]
    ref = hf_logprobs(load_hf(model_dir), out.prompt_token_ids + completion.token_ids)
    n_prompt = len(out.prompt_token_ids)
    total = 0.0
    for i, (token, entry) in enumerate(zip(completion.token_ids, completion.logprobs)):
        row = ref[n_prompt - 1 + i]
        top = torch.topk(row, 3).indices.tolist()
        assert set(top) <= set(entry) and token in entry
        assert entry[token].rank == 1  # greedy picks the most likely token
        assert abs(entry[token].logprob - float(row[token])) < 1e-4
        assert entry[token].decoded_token == llm.get_tokenizer().decode([token], skip_special_tokens=False)
        total += entry[token].logprob
    assert completion.cumulative_logprob == pytest.approx(total, abs=1e-5)
    finish(llm)


def test_stop_string_is_cut_from_the_text(llm):
    free = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0]
    text = free.text
    assert len(text) > 6
    stop = text[3:6]
    first = text.index(stop)
    cut = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=24, stop=[stop], ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    assert cut.text == text[:first]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    kept = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=24, stop=stop, ignore_eos=True,
                                                   include_stop_str_in_output=True), use_tqdm=False)[0]
    assert kept.outputs[0].text == text[:first + len(stop)]
    finish(llm)


def test_stop_token_ids_and_min_tokens(llm):
    free = llm.generate(PROMPTS[3], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0].token_ids
    stop_id = free[4]
    first = free.index(stop_id)
    out = llm.generate(PROMPTS[3], SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[stop_id]),
                       use_tqdm=False)[0].outputs[0]
    assert out.token_ids == free[:first + 1] and out.stop_reason == stop_id and out.finish_reason == "stop"
    # min_tokens forbids the stop token until enough tokens were generated
    late = llm.generate(PROMPTS[3], SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[stop_id],
                                                   min_tokens=first + 2), use_tqdm=False)[0].outputs[0]
    assert stop_id not in late.token_ids[:first + 2]
    finish(llm)


def test_chat_applies_the_template(llm):
    messages = [{"role": "user", "content": "hello"}]
    out = llm.chat(messages, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)[0]
    tok = llm.get_tokenizer()
    expected = tok.encode("<|user|>\nhello<|end|>\n<|assistant|>\n", add_special_tokens=False)
    assert out.prompt_token_ids == expected
    finish(llm)


def test_max_tokens_none_runs_to_the_end_of_the_context(model_dir):
    llm = LLM(model=model_dir, block_size=4, num_kv_blocks=64, max_model_len=24)
    out = llm.generate({"prompt_token_ids": [5] * 20}, SamplingParams(max_tokens=None, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 4 and out.finish_reason == "length"
    finish(llm)


@pytest.mark.parametrize("prompt, params, field", [
    ({"prompt_token_ids": [1] * 256}, SamplingParams(), "max_model_len"),
    ({"prompt_token_ids": [1, 320]}, SamplingParams(), "prompt_token_ids[1]"),
    ({"prompt_token_ids": [1, -1]}, SamplingParams(), "prompt_token_ids[1]"),
    ({"prompt_token_ids": []}, SamplingParams(), "prompt_token_ids"),
    ("", SamplingParams(), "prompt"),
    ("hi", SamplingParams(logprobs=21), "logprobs"),
    ("hi", SamplingParams(stop_token_ids=[1000]), "stop_token_ids"),
    (42, SamplingParams(), "prompt"),
])
def test_bad_requests_are_refused_by_name(llm, prompt, params, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        llm.generate([PROMPTS[0], prompt], params, use_tqdm=False)
    finish(llm)  # the valid first prompt was withdrawn too: nothing half-run, nothing leaked


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_k": -2}, "top_k"),
    ({"min_p": 1.5}, "min_p"), ({"max_tokens": 0}, "max_tokens"), ({"n": 0}, "n"),
    ({"presence_penalty": 3}, "presence_penalty"), ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"), ({"stop": [""]}, "stop"),
])
def test_bad_sampling_params_are_refused_by_name(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_bad_engine_arguments(model_dir, tmp_path):
    with pytest.raises(ValueError, match="max_model_len"):
        LLM(model=model_dir, num_kv_blocks=4, block_size=4, max_model_len=100)
    with pytest.raises(ValueError, match="dtype"):
        LLM(model=model_dir, dtype="float8")
    with pytest.raises(ValueError, match="block_size"):
        LLM(model=model_dir, block_size=3)
    with pytest.raises(ValueError):
        LLM(model=str(tmp_path / "missing"))
    llm = LLM(model=model_dir, skip_tokenizer_init=True, num_kv_blocks=64, block_size=4)
    with pytest.raises(ValueError, match="tokenizer"):
        llm.generate("text needs a tokenizer", use_tqdm=False)
    with pytest.raises(ValueError, match="stop"):
        llm.generate({"prompt_token_ids": [1, 2]}, SamplingParams(stop=["x"]), use_tqdm=False)
    with pytest.raises(ValueError, match="sampling_params"):
        llm.generate(["a", "b"], [SamplingParams()], use_tqdm=False)


class _ConfigOnly:
    """Stands in for LLMEngine: keeps the config LLM built, loads nothing."""

    def __init__(self, config: EngineConfig, usage: str) -> None:
        self.config, self.usage = config, usage


def test_engine_arguments_are_routed_to_their_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llm_module, "LLMEngine", _ConfigOnly)
    config = LLM("m", dtype="bfloat16", block_size=4, max_num_seqs=3, enforce_eager=True, usage="serve").engine.config
    assert config.model_config == ModelConfig(model="m", dtype="bfloat16")
    assert config.cache_config == CacheConfig(block_size=4)
    assert config.scheduler_config == SchedulerConfig(max_num_seqs=3)
    assert config.enforce_eager is True and config.device == "auto"
    assert LLM("m").engine.config == EngineConfig(ModelConfig(model="m"))  # defaults: the dataclasses' own


def test_every_config_field_is_an_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each field of the four config classes reaches its class through LLM (a new field needs no edit there)."""
    monkeypatch.setattr(llm_module, "LLMEngine", _ConfigOnly)
    sections = {ModelConfig: "model_config", CacheConfig: "cache_config", SchedulerConfig: "scheduler_config"}
    names = engine_arg_names()
    assert len(names) == len(set(names)), "a field name in two config classes would be ambiguous"
    for cls in (*sections, EngineConfig):
        for field in dataclasses.fields(cls):
            if field.name in sections.values() or field.name == "model":
                continue
            value = field.default
            config = LLM("m", **{field.name: value}).engine.config
            holder = getattr(config, sections[cls]) if cls in sections else config
            assert getattr(holder, field.name) == value and field.name in names


def test_unknown_engine_argument_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llm_module, "LLMEngine", _ConfigOnly)
    with pytest.raises(TypeError, match=r"unknown engine argument\(s\) \['blok_size'\]; allowed: .*'block_size'"):
        LLM("m", blok_size=4)
    with pytest.raises(TypeError, match="cache_config"):  # sections are built from their fields, not passed
        LLM("m", cache_config=CacheConfig())


def _quantized(model_dir, tmp_path, scheme: str):  # noqa: ANN001, ANN202 - a checkpoint directory
    """A copy of `model_dir` whose config asks for `scheme` (weights loaded as dummies: each quantized layer's
    own loaders and parameters)."""
    out = tmp_path / scheme
    shutil.copytree(model_dir, out)
    args, activations = (rtn4.weight_args(32), None) if scheme == "int4" else (fp8.weight_args(0),
                                                                                  fp8.RECIPE.input_activations)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = config_dict(args, ["lm_head"], activations)
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("scheme", [None, "int4", "fp8"])
def test_a_dropped_engine_frees_its_weights(model_dir, tmp_path, scheme):
    """The engine freezes the heap at start-up (engine.freeze_heap): a frozen reference cycle is never collected,
    and one through a layer (its parameters' weight loaders were bound to it) kept a dropped engine's weights."""
    path = model_dir if scheme is None else _quantized(model_dir, tmp_path, scheme)
    llm = LLM(model=str(path), load_format="auto" if scheme is None else "dummy")
    llm.generate("hello", SamplingParams(max_tokens=4), use_tqdm=False)
    llm.engine.check_integrity()
    weights = [weakref.ref(p) for p in llm.engine.executor.worker.model.parameters()]
    assert gc.get_freeze_count() > 0  # the heap is frozen
    del llm
    gc.collect()
    assert sum(w() is not None for w in weights) == 0
