"""The EAGLE-3 proposer (lamina/spec/eagle.py): the target's aux features equal HF's hidden states, the paged
head drafts what the trainer's unrolled head computes (fed in one piece or in chunks, after rejected drafts),
and bad head directories are ValueErrors naming speculative_config.model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lamina.attention.metadata import AttentionMetadata, set_attention_metadata
from lamina.kv.cache import allocate_kv_caches, bind_kv_caches
from lamina.loader.hf_config import load_model_arch
from lamina.loader.model_loader import load_model
from lamina.models.common import CausalLM
from lamina.spec.eagle import EagleProposer, Feed
from lamina.spec.eagle_head import EagleHead, EagleHeadConfig, default_aux_layers, save_head
from lamina.distill.eagle_ttt import unroll
from lamina.spec.model_proposer import DraftRequest
from tests.helpers.tiny_models import make_tiny_model

transformers = pytest.importorskip("transformers")
BS = 4
# the shipped head accepts 16.9 % of its draft tokens on these prompts (k = 3, 2026-12-02: 30 of 178, by position
# 24 / 6 / 0); chance is ~1 / 8192
ACCEPTED_FLOOR = 0.08


def make_head_dir(target_dir: str | Path, out: Path, seed: int = 0, **overrides: object) -> Path:
    """A random EAGLE head for the target in `target_dir` (std 0.2 weights: peaked, distinct drafts)."""
    arch = load_model_arch(str(target_dir))
    cfg = EagleHeadConfig(arch.hidden_size, arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim,
                          2 * arch.hidden_size, tuple(default_aux_layers(arch.num_hidden_layers)),
                          arch.rms_norm_eps, arch.rope_theta, arch.max_position_embeddings)
    torch.manual_seed(seed)
    head = EagleHead(cfg)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    save_head(head, out, arch.vocab_size, str(target_dir), dtype=torch.float32, **overrides)
    return out


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model("llama", tmp_path_factory.mktemp("t"), vocab_size=128, num_hidden_layers=8)


@pytest.fixture(scope="module")
def target(target_dir: Path) -> CausalLM:
    return load_model(str(target_dir), load_model_arch(str(target_dir)), torch.float32, "cpu")


def _hf_features(target_dir: Path, tokens: list[int], layers: list[int]) -> torch.Tensor:
    hf = transformers.AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    with torch.no_grad():
        out = hf(torch.tensor([tokens]), output_hidden_states=True)
    return torch.cat([out.hidden_states[i][0] for i in layers], dim=-1)


def test_aux_hidden_states_are_the_residual_stream_entering_the_layers(target_dir: Path, target: CausalLM,
                                                                       tmp_path: Path) -> None:
    tokens = [3, 17, 5, 99, 42, 7, 7, 8]
    proposer = EagleProposer(str(make_head_dir(target_dir, tmp_path / "h")), target, torch.float32, "cpu")
    layers = list(proposer.cfg.aux_hidden_state_layers)
    assert layers == [2, 4, 5]
    _prefill(target, tokens)
    got = target.aux_hidden_states
    assert got.shape == (len(tokens), 3 * target.arch.hidden_size)
    torch.testing.assert_close(got, _hf_features(target_dir, tokens, layers), rtol=1e-4, atol=1e-4)
    target.record_aux_hidden_states(())
    _prefill(target, tokens)
    assert target.aux_hidden_states is None


def _prefill(model: CausalLM, tokens: list[int]) -> None:
    """One sequence through lamina's target, from position 0, in a fresh cache."""
    bind_kv_caches(model, allocate_kv_caches(model.arch, 8, BS, torch.float32, "cpu"))
    n = len(tokens)
    metadata = AttentionMetadata(
        slot_mapping=torch.arange(BS, BS + n), query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        seq_lens=torch.tensor([n], dtype=torch.int32), block_tables=torch.tensor([[1, 2, 3]], dtype=torch.int32),
        max_query_len=n, max_seq_len=n, query_start_loc_cpu=[0, n], seq_lens_cpu=[n])
    with torch.no_grad(), set_attention_metadata(metadata):
        model(torch.tensor(tokens), torch.arange(n))


def _reference_drafts(proposer: EagleProposer, feats: torch.Tensor, tokens: list[int], k: int) -> list[int]:
    """Drafts of the unrolled head (lamina/distill/eagle_ttt.py) after verified tokens `tokens`."""
    n = len(tokens)
    step_tokens = [torch.tensor([tokens[1:n]])]
    drafts = []
    for _ in range(k):
        outs = unroll(proposer.head, proposer.target.model.embed_tokens, feats[None, :n - 1], step_tokens)
        drafts.append(int(proposer.target.compute_logits(outs[-1][0, -1:]).argmax()))
        step_tokens.append(torch.zeros(1, n - 1, dtype=torch.long))
        step_tokens[-1][0, -1] = drafts[-1]
    return drafts


@pytest.mark.parametrize("chunks", [[9], [4, 5], [1, 3, 5]], ids=["one", "two", "three"])
def test_paged_drafts_equal_the_unrolled_head(target_dir: Path, target: CausalLM, tmp_path: Path,
                                              chunks: list[int]) -> None:
    tokens = [5, 9, 1, 44, 3, 3, 70, 2, 11, 64]  # N = 10: positions 0 .. 8 are fed
    proposer = EagleProposer(str(make_head_dir(target_dir, tmp_path / "h")), target, torch.float32, "cpu")
    proposer.bind_cache(16, BS)
    feats = _hf_features(target_dir, tokens, list(proposer.cfg.aux_hidden_state_layers))
    blocks = [3, 7, 1, 12]  # cover [0, N - 1 + k) = [0, 13)
    start = 0
    for count in chunks:
        request = [DraftRequest("r", tokens, blocks, 4)] if start + count == len(tokens) - 1 else []
        drafts = proposer.propose_fed([Feed("r", tokens, blocks, start, count, 0)], request,
                                      feats[start:start + count])
        start += count
    assert drafts == [_reference_drafts(proposer, feats, tokens, 4)]
    # The drafts are rejected: the next step verifies 2 more tokens; the stale draft KV is overwritten.
    longer = tokens + [drafts[0][0] ^ 1, 8]
    feats = _hf_features(target_dir, longer, list(proposer.cfg.aux_hidden_state_layers))
    got = proposer.propose_fed([Feed("r", longer, blocks, 9, 2, 0)], [DraftRequest("r", longer, blocks, 2)],
                               feats[9:11])
    assert got == [_reference_drafts(proposer, feats, longer, 2)]


def test_no_drafts_for_a_request_whose_feed_stops_short(target_dir: Path, target: CausalLM, tmp_path: Path) -> None:
    proposer = EagleProposer(str(make_head_dir(target_dir, tmp_path / "h")), target, torch.float32, "cpu")
    proposer.bind_cache(8, BS)
    tokens = [1, 2, 3, 4, 5, 6]
    feats = torch.randn(6, 3 * target.arch.hidden_size)
    got = proposer.propose_fed([Feed("a", tokens, [1, 2, 3], 0, 3, 0)],
                               [DraftRequest("a", tokens, [1, 2, 3], 3), DraftRequest("b", tokens, [4, 5, 6], 3)],
                               feats)
    assert got == [[], []]
    assert proposer.propose([DraftRequest("a", tokens, [1, 2, 3], 3)], feats[:1]) == [[]]
    assert proposer.kv_bytes_per_block(BS) == 2 * BS * 2 * 16 * 4  # one layer, 2 kv heads of 16, fp32


@pytest.mark.parametrize("overrides, match", [
    ({"hidden_size": 32}, "hidden_size 32"),
    ({"vocab_size": 99}, "vocab_size 99"),
    ({"aux_hidden_state_layers": [1, 2, 9]}, "aux_hidden_state_layers"),
    ({"aux_hidden_state_layers": []}, "aux_hidden_state_layers"),
    ({"head_dim": "16"}, "head_dim"),
])
def test_heads_for_another_target_are_refused(target_dir: Path, target: CausalLM, tmp_path: Path,
                                              overrides: dict, match: str) -> None:
    head_dir = make_head_dir(target_dir, tmp_path / "h")
    config = json.loads((head_dir / "config.json").read_text())
    (head_dir / "config.json").write_text(json.dumps({**config, **overrides}))
    with pytest.raises(ValueError, match=f"speculative_config.model.*{match}|{match}.*speculative_config.model"):
        EagleProposer(str(head_dir), target, torch.float32, "cpu")


def test_missing_directories_and_missing_model_are_refused(target: CausalLM, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="speculative_config.model.*not an EAGLE head directory"):
        EagleProposer(str(tmp_path), target, torch.float32, "cpu")
    from lamina.config import SpeculativeConfig
    with pytest.raises(ValueError, match="model"):
        SpeculativeConfig(method="eagle")


def test_the_shipped_head_drafts_and_is_accepted_on_the_demo_model() -> None:
    """lamina/assets/demo-eagle on the demo model through the engine: greedy output identical, drafts accepted
    far more often than chance (a broken head, feed or KV would not be)."""
    from lamina import DEMO_EAGLE, DEMO_MODEL, LLM, SamplingParams
    prompts = ["import os\n\n\ndef list_files(root):", "class Stack:\n", "def fibonacci(n):"]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    outputs, stats = [], None
    for spec in (None, {"method": "eagle", "model": DEMO_EAGLE, "num_speculative_tokens": 3, "adaptive": False}):
        llm = LLM(model=DEMO_MODEL, speculative_config=spec, block_size=4, num_kv_blocks=200, max_model_len=128)
        outputs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)])
        llm.engine.check_integrity()
        stats = llm.engine.get_stats().spec
    assert outputs[1] == outputs[0]
    assert stats.num_draft_tokens > 40 and stats.num_accepted_tokens > ACCEPTED_FLOOR * stats.num_draft_tokens


def test_the_captured_loops_draft_what_the_unrolled_head_does(target_dir: Path, target: CausalLM,
                                                              tmp_path: Path) -> None:
    """compile_and_capture (EagerGraph on CPU, the Triton kernels under the interpreter, as a CUDA graph runs them):
    one call feeds a long prompt that drafts (its prefix eagerly), a verify's two positions, a prompt chunk that
    does not draft (eagerly, all of it) and a one-token feed of a request without drafts, in a bucket with a
    padding row; a later feed-only call (nobody drafts) and a drafting call after it give the unrolled head's
    drafts."""
    import tests.kernels.conftest  # noqa: F401 - TRITON_INTERPRET=1 and the interpreter fixes
    from lamina.graphs import EagerGraph

    proposer = EagleProposer(str(make_head_dir(target_dir, tmp_path / "h")), target, torch.float32, "cpu", "triton")
    proposer.bind_cache(32, BS)
    proposer.compile_and_capture(max_batch_size=8, max_model_len=64, num_drafts=3, warm_up=None,
                                 graph_cls=EagerGraph)
    layers = list(proposer.cfg.aux_hidden_state_layers)
    seqs = {"a": [5, 9, 1, 44, 3, 3, 70, 2, 11, 64], "b": [8, 1, 6, 6, 2], "c": list(range(20, 32)),
            "d": [4, 4, 9]}
    blocks = {"a": [3, 7, 1, 12], "b": [5, 2, 9], "c": [10, 11, 13, 14], "d": [15, 16]}
    feats = {r: _hf_features(target_dir, tokens, layers) for r, tokens in seqs.items()}

    def call(spans: dict[str, tuple[int, int]], drafting: dict[str, int]) -> dict[str, list[int]]:
        feeds, rows, row = [], [], 0
        for r, (start, count) in spans.items():
            feeds.append(Feed(r, seqs[r], blocks[r], start, count, row))
            rows.append(feats[r][start:start + count])
            row += count
        requests = [DraftRequest(r, seqs[r], blocks[r], k) for r, k in drafting.items()]
        return dict(zip(drafting, proposer.propose_fed(feeds, requests, torch.cat(rows))))

    # b's first 2 positions and d's first one were fed by an earlier (eager-sized) call
    call({"b": (0, 2), "d": (0, 1)}, {})
    got = call({"a": (0, 9), "b": (2, 2), "c": (0, 5), "d": (1, 1)}, {"a": 3, "b": 2, "c": 3})
    assert got == {"a": _reference_drafts(proposer, feats["a"], seqs["a"], 3),
                   "b": _reference_drafts(proposer, feats["b"], seqs["b"], 2), "c": []}
    call({"c": (5, 4)}, {})  # feed-only: the feeding loop
    got = call({"c": (9, 2)}, {"c": 3})
    assert got == {"c": _reference_drafts(proposer, feats["c"], seqs["c"], 3)}
