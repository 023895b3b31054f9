"""End to end under the Triton interpreter: lamina with attention_backend="triton" produces HF's
greedy tokens on a tiny Qwen3 (head_dim 64), with chunked prefill forced and a 2-block prefix hit."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is not installed (CI installs it with the test extra)")

from lamina import LLM, SamplingParams  # noqa: E402
from tests.helpers.hf_oracle import hf_greedy, load_hf  # noqa: E402
from tests.helpers.tiny_models import make_tiny_model  # noqa: E402

MAX_NEW = 6


def test_triton_backend_greedy_matches_hf(tmp_path: Path) -> None:
    path = str(make_tiny_model("qwen3", tmp_path / "qwen3", hidden_size=128, num_attention_heads=2,
                               num_key_value_heads=1, head_dim=64, num_hidden_layers=2))
    hf = load_hf(path)
    base = [(7 * i + 3) % 256 for i in range(37)]
    # The 2nd prompt finds 2 blocks (32 tokens) of the 1st in the prefix cache; its 10 new tokens then
    # go through the prefill kernel over that cached prefix.
    prompts = [base, base[:32] + list(range(40, 50)), [200, 17, 4, 99, 250]]
    expected = [hf_greedy(hf, p, MAX_NEW) for p in prompts]
    llm = LLM(model=path, skip_tokenizer_init=True, attention_backend="triton", device="cpu", block_size=16,
              num_kv_blocks=32, max_num_batched_tokens=12)
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
    first = llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False)
    assert llm.engine.get_stats().num_steps > MAX_NEW  # the 37-token prompt went in chunks of <= 12
    rest = llm.generate([{"prompt_token_ids": p} for p in prompts[1:]], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in first + rest] == expected
    llm.engine.check_integrity()
    assert llm.engine.get_stats().prefix_cache_hit_rate > 0


def test_triton_backend_tree_drafts_are_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tree drafts of a draft model close to the target through the Triton kernels (the verify step's tree mask in
    the decode kernel, the drafter's tree levels too): greedy tokens equal HF's, and some accepted path left the
    main chain (its KV moved)."""
    from tests.helpers.spec_tree import count_off_chain, perturbed_copy
    path = str(make_tiny_model("qwen3", tmp_path / "qwen3", hidden_size=128, num_attention_heads=2,
                               num_key_value_heads=1, head_dim=64, num_hidden_layers=2, vocab_size=64))
    draft = str(perturbed_copy(path, tmp_path / "draft"))
    prompts = [[(7 * i + 3) % 64 for i in range(11)], [5, 17, 4, 9, 50]]
    new = 12
    hf = load_hf(path)
    expected = [hf_greedy(hf, p, new) for p in prompts]
    tree = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    llm = LLM(model=path, skip_tokenizer_init=True, attention_backend="triton", device="cpu", block_size=16,
              num_kv_blocks=32, speculative_config={"method": "draft_model", "model": draft,
                                                    "speculative_token_tree": tree, "adaptive": False})
    moved = count_off_chain(monkeypatch)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=new, ignore_eos=True), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected
    llm.engine.check_integrity()
    assert llm.engine.get_stats().spec.num_accepted_tokens > 0 and any(moved), moved
