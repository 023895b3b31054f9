"""Tree drafts in the engine (speculative_token_tree, lamina/spec/draft_tree.py): greedy and seeded output
token-identical to no speculation (with the prefix cache off, chunked prefill, preemption, logprobs, n = 2) while
accepted paths leave the main chain (their KV moved to the slots of their positions), more tokens a verify step than
the tree's main chain alone, and a clear error for a tree larger than the Triton kernels take (the kernels' own
tree test: tests/kernels/test_decode_attention.py; end to end: tests/kernels/test_triton_e2e.py)."""
from __future__ import annotations

import pytest

from lamina import LLM, SamplingParams
from tests.helpers.spec_tree import count_off_chain, perturbed_copy
from tests.engine.test_spec_methods import ENGINES, GREEDY, IDS, PROMPTS, _run, model_dir  # noqa: F401 (fixture)

TREE = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (2,)]
SEEDED = SamplingParams(temperature=0.8, max_tokens=30, ignore_eos=True, seed=5, logprobs=2)


@pytest.fixture(scope="module")
def draft_dir(model_dir: str, tmp_path_factory) -> str:  # noqa: F811
    """A draft model close to the target, not equal: paths often leave the main chain."""
    return str(perturbed_copy(model_dir, tmp_path_factory.mktemp("tree_draft")))


def tree_spec(draft_dir: str, tree: list = TREE) -> dict:
    return {"method": "draft_model", "model": draft_dir, "speculative_token_tree": tree, "adaptive": False}


@pytest.fixture
def off_chain(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    return count_off_chain(monkeypatch)


@pytest.mark.parametrize("engine", ENGINES, ids=IDS)
def test_tree_drafts_are_exact_greedy(model_dir: str, draft_dir: str, engine: dict,  # noqa: F811
                                      off_chain: list[int]) -> None:
    want, _ = _run(model_dir, None, **engine)
    got, llm = _run(model_dir, tree_spec(draft_dir), **engine)
    assert got == want
    stats = llm.engine.get_stats().spec
    assert stats.num_draft_tokens > 100 and stats.num_accepted_tokens > 20, stats
    assert sum(off_chain) >= 3, off_chain  # KV moved: later tokens read it
    assert len(stats.accepted_per_pos) == 3  # per depth


def test_tree_drafts_are_exact_seeded_with_logprobs_and_n(model_dir: str, draft_dir: str,  # noqa: F811
                                                          off_chain: list[int]) -> None:
    params = [SEEDED, SamplingParams(temperature=0.8, max_tokens=30, ignore_eos=True, seed=9, n=2)]
    for p in params:
        want, plain = _run(model_dir, None, p)
        got, llm = _run(model_dir, tree_spec(draft_dir), p)
        assert got == want
    outs = [llm.generate(PROMPTS, SEEDED, use_tqdm=False) for llm in (plain, llm)]
    pairs = [(a, b) for x, y in zip(*outs) for a, b in zip(x.outputs[0].logprobs, y.outputs[0].logprobs)]
    assert len(pairs) == 30 * len(PROMPTS)
    for want_token, got_token in pairs:  # the same tokens and ranks; values to float rounding (rows batched apart)
        assert {t: p.rank for t, p in want_token.items()} == {t: p.rank for t, p in got_token.items()}
        assert all(abs(want_token[t].logprob - got_token[t].logprob) < 1e-4 for t in want_token)
    assert sum(off_chain) >= 3, off_chain


def test_a_tree_yields_more_than_its_main_chain(model_dir: str, draft_dir: str) -> None:  # noqa: F811
    """The same prompts through the tree and through its main chain alone (3 drafts): more tokens a verify step."""
    _, chain = _run(model_dir, {"method": "draft_model", "model": draft_dir, "num_speculative_tokens": 3,
                                "adaptive": False})
    _, tree = _run(model_dir, tree_spec(draft_dir))
    assert tree.engine.get_stats().spec.mean_accepted_length > chain.engine.get_stats().spec.mean_accepted_length


def test_the_triton_kernels_take_trees_of_at_most_7_nodes(model_dir: str, draft_dir: str) -> None:  # noqa: F811
    big = TREE + [(3,)]
    with pytest.raises(ValueError, match="speculative_token_tree: the Triton kernels verify trees of at most 7"):
        LLM(model=model_dir, speculative_config=tree_spec(draft_dir, big), attention_backend="triton",
            num_kv_blocks=64)
    got, _ = _run(model_dir, tree_spec(draft_dir, big))  # the torch path takes it
    assert got == _run(model_dir, None)[0]
