"""The EAGLE-3 proposer (lamina/spec/eagle.py): the target's aux features equal HF's hidden states, the paged
head drafts what the trainer's unrolled head computes (features stored in one piece or in chunks, drafting
between them or only at the end, after rejected drafts, after `forget`), and bad head directories are
ValueErrors naming speculative_config.model."""
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
from lamina.spec.draft_loop import WIDE_TOKENS, DraftLoops
from lamina.spec.eagle import EagleProposer, feature_store
from lamina.spec.eagle_head import EagleHead, EagleHeadConfig, default_aux_layers, save_head
from lamina.distill.eagle_ttt import unroll
from lamina.spec.model_proposer import DraftRequest, Drafts
from tests.helpers.tiny_models import make_tiny_model

transformers = pytest.importorskip("transformers")
BS = 4
# the shipped head accepts 19.8 % of its draft tokens on these prompts (k = 3, CPU float32, 2026-12-03: 34 of 172);
# chance is ~1 / 8192
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
    recorded: list[torch.Tensor] = []
    target.record_aux_hidden_states(tuple(layers), sink=recorded.append)
    _prefill(target, tokens)
    (got,) = recorded
    assert got.shape == (len(tokens), 3 * target.arch.hidden_size)
    torch.testing.assert_close(got, _hf_features(target_dir, tokens, layers), rtol=1e-4, atol=1e-4)
    target.record_aux_hidden_states((5, 2), sink=recorded.append)  # the sink's columns follow the given order
    _prefill(target, tokens)
    torch.testing.assert_close(recorded[1], _hf_features(target_dir, tokens, [5, 2]), rtol=1e-4, atol=1e-4)
    target.record_aux_hidden_states((), sink=recorded.append)
    _prefill(target, tokens)
    assert len(recorded) == 2  # () stops recording


def test_feature_store_writes_each_token_at_its_slot_and_padding_to_the_spare_row() -> None:
    hidden, slots = 4, [5, -1, 0, -1, 2]
    features = torch.full((8 + 1, hidden), 7.0)  # 8 KV slots, then the spare row
    fc = torch.nn.Linear(3 * hidden, hidden)
    aux = torch.randn(len(slots), 3 * hidden)
    metadata = AttentionMetadata(
        slot_mapping=torch.tensor(slots), query_start_loc=torch.tensor([0, 5], dtype=torch.int32),
        seq_lens=torch.tensor([5], dtype=torch.int32), block_tables=torch.tensor([[0, 1]], dtype=torch.int32),
        max_query_len=5, max_seq_len=5, query_start_loc_cpu=[0, 5], seq_lens_cpu=[5])
    with torch.no_grad(), set_attention_metadata(metadata):
        feature_store(features, fc, torch.float32)(aux)
        want = fc(aux)
    for row, slot in enumerate(slots):
        if slot >= 0:
            torch.testing.assert_close(features[slot], want[row])
    untouched = [1, 3, 4, 6, 7]
    assert torch.equal(features[untouched], torch.full((len(untouched), hidden), 7.0))
    assert any(torch.equal(features[-1], want[row]) for row in (1, 3))  # both padding rows land there


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


def _slots(blocks: list[int], start: int, count: int) -> list[int]:
    return [blocks[p // BS] * BS + p % BS for p in range(start, start + count)]


def compute(target: CausalLM, tokens: list[int], blocks: list[int], start: int, count: int) -> None:
    """The target computes positions [start, start + count) of `tokens` as a step does (its KV and, through its
    aux sink, an EAGLE proposer's stored features at the positions' slots in `blocks`)."""
    end = start + count
    slots = _slots(blocks, start, count)
    metadata = AttentionMetadata(
        slot_mapping=torch.tensor(slots), query_start_loc=torch.tensor([0, count], dtype=torch.int32),
        seq_lens=torch.tensor([end], dtype=torch.int32), block_tables=torch.tensor([blocks], dtype=torch.int32),
        max_query_len=count, max_seq_len=end, query_start_loc_cpu=[0, count], seq_lens_cpu=[end])
    with torch.no_grad(), set_attention_metadata(metadata):
        target(torch.tensor(tokens[start:end]), torch.arange(start, end))


def _proposer(target_dir: Path, target: CausalLM, tmp_path: Path, num_blocks: int, backend: str = "auto"
              ) -> EagleProposer:
    """A random head over `target`, both with caches of num_blocks blocks of BS."""
    proposer = EagleProposer(str(make_head_dir(target_dir, tmp_path / "h")), target, torch.float32, "cpu", backend)
    proposer.bind_cache(num_blocks, BS)
    bind_kv_caches(target, allocate_kv_caches(target.arch, num_blocks, BS, torch.float32, "cpu"))
    return proposer


@pytest.mark.parametrize("chunks", [[9], [4, 5], [1, 3, 5]], ids=["one", "two", "three"])
def test_paged_drafts_equal_the_unrolled_head(target_dir: Path, target: CausalLM, tmp_path: Path,
                                              chunks: list[int]) -> None:
    """The target computes positions 0 .. 8 in chunks; the head drafts after each chunk (catching up on that
    chunk) or, in "one", only once at the end (catching up on all of them)."""
    tokens = [5, 9, 1, 44, 3, 3, 70, 2, 11, 64]  # N = 10: positions 0 .. 8 are fed
    proposer = _proposer(target_dir, target, tmp_path, 16)
    layers = list(proposer.cfg.aux_hidden_state_layers)
    feats = _hf_features(target_dir, tokens, layers)
    blocks = [3, 7, 1, 12]  # cover [0, N - 1 + k) = [0, 13)
    start = 0
    for count in chunks:
        compute(target, tokens, blocks, start, count)
        start += count
        if start == count:  # the target's forward stored the features; the head has not run yet
            assert not any(t.any() for kv in proposer.kv_caches for t in kv)
            assert proposer.features[_slots(blocks, 0, count)].abs().min() > 0
        seen = tokens[:start + 1]
        if len(seen) >= 2:
            drafts = proposer.propose([DraftRequest("r", seen, blocks, 4)], torch.zeros(1, 1)).tolist()
            assert drafts == [_reference_drafts(proposer, feats, seen, 4)]
    # The verify step computes positions 9 .. 13 (the newest token and the 4 drafts); draft 0 is accepted, draft 1
    # rejected: positions 9 and 10 are verified, 11 .. 13 hold rejected drafts (not read), the draft KV is stale.
    compute(target, tokens + drafts[0], blocks, 9, 5)
    longer = tokens + [drafts[0][0], drafts[0][1] ^ 1]
    feats = _hf_features(target_dir, longer, layers)
    got = proposer.propose([DraftRequest("r", longer, blocks, 2)], torch.zeros(1, 1)).tolist()
    assert got == [_reference_drafts(proposer, feats, longer, 2)]
    # Preempted and recomputed in other blocks: forget, then a catch-up from position 0.
    proposer.forget(["r"])
    moved = [9, 10, 11, 13]
    compute(target, longer, moved, 0, 11)
    got = proposer.propose([DraftRequest("r", longer, moved, 2)], torch.zeros(1, 1)).tolist()
    assert got == [_reference_drafts(proposer, feats, longer, 2)]


def test_no_drafts_for_a_request_of_one_token(target_dir: Path, target: CausalLM, tmp_path: Path) -> None:
    proposer = _proposer(target_dir, target, tmp_path, 8)
    compute(target, [1, 2, 3, 4, 5, 6], [1, 2], 0, 5)
    got = proposer.propose([DraftRequest("a", [7], [1, 2], 3), DraftRequest("b", [1, 2, 3, 4, 5, 6], [1, 2], 3)],
                           torch.zeros(2, 1)).tolist()
    assert got[0] == [] and len(got[1]) == 3
    # one layer, 2 kv heads of 16, fp32; and each token's stored features (fp32)
    assert proposer.kv_bytes_per_block(BS) == 2 * BS * 2 * 16 * 4 + BS * target.arch.hidden_size * 4


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


@pytest.mark.parametrize("wide_tokens", [WIDE_TOKENS, 8])
def test_the_captured_loops_draft_what_the_unrolled_head_does(target_dir: Path, target: CausalLM,
                                                              tmp_path: Path, wide_tokens: int) -> None:
    """compile_and_capture (EagerGraph on CPU, the Triton kernels under the interpreter, as a CUDA graph runs them):
    one call drafts for a long prompt, a request two positions behind and a short one, in a bucket with a padding
    row; a request that did not draft while 11 positions were computed catches up on all of them in the next call;
    each gives the unrolled head's drafts, its argmax even for requests that sample (the head's drafts are not
    sampled: lamina/spec/eagle.py). The default loops replay the long catch-ups in a wide loop; with wide_tokens 8
    (a wide loop of one row of 8 tokens) the first call feeds the long prompt eagerly but for its base and replays
    the narrow loop, the second feeds the 11 positions eagerly but for the base and replays the wide loop."""
    import tests.kernels.conftest  # noqa: F401 - TRITON_INTERPRET=1 and the interpreter fixes
    from lamina.graphs import EagerGraph

    proposer = _proposer(target_dir, target, tmp_path, 32, "triton")
    proposer.compile_and_capture(max_batch_size=8, max_model_len=64, num_drafts=3, warm_up=None,
                                 graph_cls=EagerGraph)
    if wide_tokens != WIDE_TOKENS:
        proposer.loops.drafting = DraftLoops(proposer.loops.net, 3, 8, 64, proposer.block_size, proposer.device,
                                             EagerGraph, samples=False, wide_tokens=wide_tokens)
        proposer.loops.drafting.capture_all()
    layers = list(proposer.cfg.aux_hidden_state_layers)
    seqs = {"a": [5, 9, 1, 44, 3, 3, 70, 2, 11, 64], "b": [8, 1, 6, 6, 2], "c": list(range(20, 32)),
            "d": [4, 4, 9]}
    blocks = {"a": [3, 7, 1, 12], "b": [5, 2, 9], "c": [10, 11, 13, 14], "d": [15, 16]}
    feats = {r: _hf_features(target_dir, tokens, layers) for r, tokens in seqs.items()}

    def propose(drafting: dict[str, int]) -> dict[str, list[int]]:
        requests = [DraftRequest(r, seqs[r], blocks[r], k, seed=7, temperature=0.9) for r, k in drafting.items()]
        return dict(zip(drafting, proposer.propose(requests, torch.zeros(len(requests), 1)).tolist()))

    for r, start, count in (("b", 0, 2), ("d", 0, 1), ("a", 0, 9), ("b", 2, 2), ("c", 0, 5), ("d", 1, 1)):
        compute(target, seqs[r], blocks[r], start, count)
    got = propose({"a": 3, "b": 2, "d": 1})
    assert got == {r: _reference_drafts(proposer, feats[r], seqs[r], k) for r, k in (("a", 3), ("b", 2), ("d", 1))}
    compute(target, seqs["c"], blocks["c"], 5, 6)
    assert propose({"c": 3}) == {"c": _reference_drafts(proposer, feats["c"], seqs["c"], 3)}
    fed = seqs["c"][1:12] if wide_tokens == WIDE_TOKENS else seqs["c"][11:12]  # positions [0, 11), or the base
    assert proposer.loops.drafting.wide[0].buffers.input_ids[:len(fed)].tolist() == fed


def test_replayed_target_steps_store_what_eager_steps_do(target_dir: Path, tmp_path: Path) -> None:
    """The target's CUDA-graph replays (EagerGraph on CPU, the Triton kernels under the interpreter) hand their
    features to the head's store as its eager steps do (a padding row's into the spare last row): the engine's drafts
    and tokens are the same either way."""
    import tests.kernels.conftest  # noqa: F401 - TRITON_INTERPRET=1 and the interpreter fixes
    from lamina import LLM, SamplingParams
    from lamina.graphs import EagerGraph
    from lamina.worker.cuda_graphs import CudaGraphRunner

    spec = {"method": "eagle", "model": str(make_head_dir(target_dir, tmp_path / "h")), "num_speculative_tokens": 3,
            "adaptive": False}
    prompts = [{"prompt_token_ids": p} for p in ([5, 9, 1, 44, 3], [8, 1, 6], [20, 21, 22, 23, 24, 25, 26])]

    def run(graphs: bool) -> tuple[list, list]:
        llm = LLM(model=str(target_dir), skip_tokenizer_init=True, attention_backend="triton", device="cpu",
                  block_size=BS, num_kv_blocks=64, max_num_seqs=4, max_model_len=64, speculative_config=spec)
        worker = llm.engine.executor.worker
        if graphs:
            worker.runner.graphs = CudaGraphRunner(worker.model, 4, worker.max_model_len, BS, torch.device("cpu"),
                                                   graph_cls=EagerGraph, query_lens=(1, 4))
            worker.runner.graphs.capture_all()
        proposer, drafts = worker.runner.drafter.proposer, []
        propose = proposer.propose

        def recording(requests: list, hidden: torch.Tensor) -> Drafts:
            out = propose(requests, hidden)
            drafts.append(out.tolist())
            return out
        proposer.propose = recording
        out = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
        llm.engine.check_integrity()
        return [o.outputs[0].token_ids for o in out], drafts

    eager, replayed = run(False), run(True)
    assert replayed == eager and sum(len(d) for call in eager[1] for d in call) > 20


def _reference_children(proposer: EagleProposer, feats: torch.Tensor, tokens: list[int], path: list[int],
                        count: int) -> list[int]:
    """The unrolled head's top `count` tokens after verified `tokens` and then the drafts `path`."""
    n = len(tokens)
    step_tokens = [torch.tensor([tokens[1:n]])]
    for token in path:
        step_tokens.append(torch.zeros(1, n - 1, dtype=torch.long))
        step_tokens[-1][0, -1] = token
    outs = unroll(proposer.head, proposer.target.model.embed_tokens, feats[None, :n - 1], step_tokens)
    return proposer.target.compute_logits(outs[-1][0, -1:])[0].topk(count).indices.tolist()


def test_tree_drafts_equal_the_unrolled_head_along_each_path(target_dir: Path, target: CausalLM,
                                                             tmp_path: Path) -> None:
    """A static tree (speculative_token_tree): each node's children are the unrolled head's top tokens after the
    node's own path (its draft fed with its parent's y; siblings unseen), for the whole tree and for its first 4
    nodes; a second call after a verify step that accepted a path off the main chain catches up as a chain's does."""
    from lamina.spec.draft_tree import DraftTree
    tree = DraftTree.of([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    tokens = [5, 9, 1, 44]  # a short context: a node that saw a sibling's key would draft otherwise
    proposer = _proposer(target_dir, target, tmp_path, 16)
    proposer.tree = tree
    layers = list(proposer.cfg.aux_hidden_state_layers)
    blocks = [3, 7, 1]
    compute(target, tokens, blocks, 0, 3)
    feats = _hf_features(target_dir, tokens, layers)
    for m in (7, 4):
        got = proposer.propose([DraftRequest("r", tokens, blocks, m)], torch.zeros(1, 1)).tolist()[0]
        assert len(got) == m
        for node in [-1, *range(m)]:
            kids = tree.children(node, m)
            path = [] if node < 0 else [got[a] for a in tree.ancestors(node)]
            if kids:
                assert [got[c] for c in kids] == _reference_children(proposer, feats, tokens, path, len(kids)), node
    # the verify step computed the root and the nodes; the target took node 3 ((1,)), then a token of its own
    compute(target, tokens + got, blocks, 3, 1 + m)
    longer = tokens + [got[3], 17]
    compute(target, longer, blocks, 4, 1)  # node 3's KV moved into place: here, computed there again
    feats = _hf_features(target_dir, longer, layers)
    again = proposer.propose([DraftRequest("r", longer, blocks, 4)], torch.zeros(1, 1)).tolist()[0]
    assert [again[c] for c in tree.children(-1, 4)] == _reference_children(proposer, feats, longer, [], 2)
    assert again[1] == _reference_children(proposer, feats, longer, [again[0]], 1)[0]
