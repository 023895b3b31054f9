"""The worker-side proposers in the engine (draft model, early exit, EAGLE; Medusa in tests/spec/test_medusa.py's engine
test): greedy output token-identical to no speculation under the prefix cache on and off, chunked prefill and
preemption; the lookahead KV slots they draft into are held and freed with the request (check_integrity)."""
from __future__ import annotations

import gc
import weakref

import pytest

from lamina import DEMO_EAGLE, DEMO_MEDUSA, DEMO_MODEL, LLM, SamplingParams
from tests.helpers.tiny_models import make_tiny_model
from tests.helpers.tiny_tokenizer import save_tiny_tokenizer

PROMPTS = ["def f(x): return x + 1\ndef f(x): return", "a = [1, 2, 3", "print(", "x", "class A:\n    pass"]
GREEDY = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = make_tiny_model("llama", tmp_path_factory.mktemp("target"), vocab_size=320, num_hidden_layers=3)
    save_tiny_tokenizer(path, vocab_size=300)
    return str(path)


def _run(model_dir: str, spec: dict | None, params: SamplingParams | list[SamplingParams] = GREEDY,
         **engine) -> tuple[list, LLM]:
    engine = {"block_size": 4, "num_kv_blocks": 160, "max_model_len": 128, **engine}
    llm = LLM(model=model_dir, speculative_config=spec, **engine)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    llm.engine.check_integrity()
    return [o.outputs[0].token_ids for o in outputs], llm


ENGINES = [{}, {"enable_prefix_caching": False}, {"max_num_batched_tokens": 8},
           {"num_kv_blocks": 36, "max_num_batched_tokens": 16}]
IDS = ["default", "no-prefix-cache", "chunked", "preemption"]


@pytest.mark.parametrize("engine", ENGINES, ids=IDS)
def test_draft_model_is_exact_and_accepted(model_dir: str, engine: dict) -> None:
    """The target drafting for itself: every draft is accepted (greedy), and the output is unchanged."""
    spec = {"method": "draft_model", "model": model_dir, "num_speculative_tokens": 3, "adaptive": False}
    want, _ = _run(model_dir, None, **engine)
    got, llm = _run(model_dir, spec, **engine)
    assert got == want
    stats = llm.engine.get_stats().spec
    assert stats.num_draft_tokens > 50 and stats.num_accepted_tokens == stats.num_draft_tokens
    if engine.get("num_kv_blocks") == 36:
        assert llm.engine.get_stats().num_preemptions > 0


@pytest.mark.parametrize("engine", ENGINES, ids=IDS)
def test_early_exit_is_exact(model_dir: str, engine: dict) -> None:
    want, _ = _run(model_dir, None, **engine)
    got, llm = _run(model_dir, {"method": "early_exit", "exit_layer": 2, "num_speculative_tokens": 2,
                                           "adaptive": False}, **engine)
    assert got == want
    stats = llm.engine.get_stats().spec
    assert stats.num_draft_tokens > 50 and 0 < stats.num_accepted_tokens < stats.num_draft_tokens


def test_a_draft_model_with_another_vocabulary_is_a_clear_error(model_dir: str, tmp_path) -> None:
    other = make_tiny_model("llama", tmp_path / "other", vocab_size=256)
    with pytest.raises(ValueError, match="speculative_config.model"):
        LLM(model=model_dir, speculative_config={"method": "draft_model", "model": str(other)}, num_kv_blocks=64)


@pytest.fixture(scope="module")
def eagle_drafts(model_dir: str, tmp_path_factory) -> tuple[str, dict]:
    """A random EAGLE head, and the drafts it makes in the default engine, keyed by the verified tokens."""
    from tests.spec.test_eagle import make_head_dir
    head = str(make_head_dir(model_dir, tmp_path_factory.mktemp("eagle") / "head"))
    return head, _eagle_run(model_dir, head, {})[1]


def _eagle_run(model_dir: str, head: str, engine: dict) -> tuple[list, dict, LLM]:
    from lamina.spec.eagle import EagleProposer
    seen: dict = {}
    original = EagleProposer.propose

    def spy(self, requests, hidden):  # noqa: ANN001, ANN202 - records what the engine drafted
        drafts = original(self, requests, hidden)
        seen.update({tuple(r.token_ids): tuple(d) for r, d in zip(requests, drafts.tolist())})
        return drafts
    EagleProposer.propose = spy
    try:
        got, llm = _run(model_dir, {"method": "eagle", "model": head, "num_speculative_tokens": 3,
                                    "adaptive": False}, **engine)
    finally:
        EagleProposer.propose = original
    return got, seen, llm


@pytest.mark.parametrize("engine", ENGINES, ids=IDS)
def test_eagle_is_exact_and_fed_every_position(model_dir: str, engine: dict, eagle_drafts: tuple) -> None:
    """A random EAGLE head (it drafts, seldom right): greedy output unchanged; and after the same verified
    tokens it drafts the same tokens whatever the chunking, caching or preemption (its KV is complete)."""
    head, reference = eagle_drafts
    want, _ = _run(model_dir, None, **engine)
    got, seen, llm = _eagle_run(model_dir, head, engine)
    assert got == want
    stats = llm.engine.get_stats().spec
    assert stats.num_draft_tokens > 50 and len(seen) > 20
    common = set(seen) & set(reference)
    # (a request short of KV blocks drafts fewer tokens: a prefix of the same chain)
    assert len(common) > 0.8 * len(seen) and all(seen[key] == reference[key][:len(seen[key])] for key in common)
    if engine.get("num_kv_blocks") == 36:
        assert llm.engine.get_stats().num_preemptions > 0


def _demo(method: str) -> tuple[str, dict]:
    return DEMO_MODEL, {"method": method, "model": DEMO_EAGLE if method == "eagle" else DEMO_MEDUSA,
                        "num_speculative_tokens": 2, "adaptive": False}


@pytest.mark.parametrize("method", ["ngram", "draft_model", "early_exit", "eagle", "medusa"])
def test_a_dropped_engine_frees_its_weights(model_dir: str, method: str) -> None:
    """The heap is frozen after start-up (engine.freeze_heap), so a reference cycle through the worker (the step
    kept by the runner, whose drafting callback held the runner) outlived a dropped engine with every weight."""
    spec = {"method": method, "num_speculative_tokens": 2, "adaptive": False,
            **({"model": model_dir} if method == "draft_model" else {}),
            **({"exit_layer": 2} if method == "early_exit" else {})}
    target, spec = _demo(method) if method in ("eagle", "medusa") else (model_dir, spec)
    llm = LLM(model=target, speculative_config=spec, block_size=4, num_kv_blocks=160, max_model_len=128)
    llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    llm.engine.check_integrity()
    assert method == "ngram" or llm.engine.get_stats().spec.num_draft_tokens > 0  # the worker's proposer drafted
    worker = llm.engine.executor.worker
    weights = [weakref.ref(p) for m in (worker.model, getattr(worker.proposer, "model", None)) if m is not None
               for p in m.parameters()]
    assert gc.get_freeze_count() > 0
    del llm, worker
    gc.collect()
    assert sum(w() is not None for w in weights) == 0


def test_the_target_drafting_for_itself_at_temperature_is_accepted(model_dir: str) -> None:
    """Drafts drawn with the verify rows' noise from q = p are those rows' own samples: (nearly) every one is
    accepted, seeded or not, where argmax drafts would be accepted with p(argmax) only."""
    spec = {"method": "draft_model", "model": model_dir, "num_speculative_tokens": 3, "adaptive": False}
    params = [SamplingParams(temperature=0.8, max_tokens=30, ignore_eos=True, seed=None if i % 2 else i)
              for i in range(len(PROMPTS))]
    _, llm = _run(model_dir, spec, params)
    stats = llm.engine.get_stats().spec
    assert stats.num_draft_tokens > 50 and stats.num_accepted_tokens >= 0.95 * stats.num_draft_tokens, stats


SAMPLED_CASES = [("draft_model", engine) for engine in ENGINES] + [("early_exit", {})]


@pytest.mark.parametrize(("method", "engine"), SAMPLED_CASES,
                         ids=[f"{m}-{i}" for (m, _), i in zip(SAMPLED_CASES, [*IDS, "default"])])
def test_sampled_drafts_leave_a_seeded_requests_tokens_unchanged(model_dir: str, method: str, engine: dict) -> None:
    """Whatever a drafter proposes, a verify row emits its own sample: seeded output at temperature is
    token-identical with and without speculation, for the methods that sample their drafts, with the prefix cache
    on and off, chunked prefill and preemption."""
    spec = {"method": method, "num_speculative_tokens": 3, "adaptive": False,
            **({"model": model_dir} if method == "draft_model" else {"exit_layer": 2})}
    params = [SamplingParams(temperature=0.8, top_p=0.95, max_tokens=30, ignore_eos=True, seed=s) for s in range(5)]
    want, _ = _run(model_dir, None, params, **engine)
    got, llm = _run(model_dir, spec, params, **engine)
    assert got == want
    stats = llm.engine.get_stats().spec
    assert stats.num_draft_tokens > 50 and stats.num_accepted_tokens > 0, stats
    if engine.get("num_kv_blocks") == 36:
        assert llm.engine.get_stats().num_preemptions > 0
