"""DraftTree (order, walk, TreeMask rows, KV moves), speculative_token_tree's validation, and the draft model's tree
drafts against HF transformers: every node's children are the draft model's best tokens after the node's own path
(greedy) or its race's first finishers with the verify row's key (sampled), over rounds whose accepted paths leave
the main chain (stale draft KV)."""
from __future__ import annotations

import random

import pytest
import torch

from lamina.attention.metadata import TreeMask
from lamina.config import SpeculativeConfig
from lamina.layers.sampling_metadata import seeded_keys
from lamina.spec.draft_tree import DraftTree
from lamina.spec.model_proposer import DraftRequest
from tests.spec.test_draft_model import (BLOCK_SIZE, SENTINEL, Blocks, dirs, hf_draft, make_proposer,  # noqa: F401
                                         prompts)

PATHS = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (2,)]
TREE = DraftTree.of(PATHS)


def test_nodes_are_numbered_main_chain_first_then_by_depth() -> None:
    assert TREE.paths == ((0,), (0, 0), (0, 0, 0), (1,), (2,), (0, 1), (1, 0))
    assert TREE.parents == (-1, 0, 1, -1, -1, 0, 3)
    assert TREE.depths == (1, 2, 3, 1, 1, 2, 2)
    assert TREE.children(-1, 7) == [0, 3, 4] and TREE.children(-1, 4) == [0, 3] and TREE.children(0, 7) == [1, 5]
    assert TREE.levels(7) == [[0, 3, 4], [1, 5, 6], [2]]
    assert all(TREE.parents[i] < i for i in range(TREE.size))  # so the first m nodes are a tree


def test_walk_follows_the_child_that_equals_the_sample() -> None:
    drafts = [10, 11, 12, 20, 30, 13, 21]  # node i's token
    # root samples 20 -> node 3; node 3 samples 21 -> node 6; node 6 samples 99: no child
    samples = [20, 0, 0, 0, 21, 0, 0, 99]
    assert TREE.walk(samples, drafts, 7) == [3, 6]
    assert TREE.walk(samples, drafts, 6) == [3]  # node 6 not verified
    assert TREE.walk([10, 11, 12, 5, 0, 0, 0, 0], drafts, 7) == [0, 1, 2]  # the main chain to its end
    assert TREE.walk([7] * 8, drafts, 7) == []
    assert TREE.moves([3, 6]) == [(4, 1), (7, 2)] and TREE.moves([0, 1, 2]) == [] and TREE.moves([0, 5]) == [(6, 2)]


def test_masks_show_the_context_and_the_ancestors() -> None:
    """A verify step's rows as a TreeMask: two context tokens computed again, the root (key 2), the 7 nodes."""
    ctx, bits = [1, 2, 3] + [3] * 7, [0, 0, 0] + [TREE.ancestor_bits(i) for i in range(7)]
    mask = TreeMask.of(ctx, bits, "cpu").dense(0, 10, 10)
    assert mask[:3].tolist() == [[j <= r for j in range(10)] for r in range(3)]  # causal up to the root
    for i in range(7):
        seen = {j for j in range(3, 10) if mask[3 + i, j]}
        assert mask[3 + i, :3].all() and seen == {3 + a for a in TREE.ancestors(i)}
    assert TREE.ancestors(6) == [3, 6] and TREE.ancestors(2) == [0, 1, 2] and TREE.ancestor_bits(6) == 0b1001000
    assert [TREE.fed_chain(m) for m in range(8)] == [0, 0, 1, 2, 2, 2, 2, 2]


@pytest.mark.parametrize("tree, message", [
    ("[(1,)]", "elder sibling"), ([(0, 0)], "parent"), ([(0,), (0,)], "twice"), ("not a tree", "list of paths"),
    ([], "list of 1 to"), ([(0,), (-1,)], "ranks"), ([(0,), ()], "ranks")])
def test_bad_trees_are_clear_errors(tree: object, message: str) -> None:
    with pytest.raises(ValueError, match=f"speculative_token_tree.*{message}"):
        SpeculativeConfig(method="draft_model", model="m", speculative_token_tree=tree)


def test_tree_config() -> None:
    config = SpeculativeConfig(method="draft_model", model="m", speculative_token_tree="[(0,), (1,), (0, 0)]")
    assert config.speculative_token_tree == ((0,), (1,), (0, 0)) and config.num_speculative_tokens == 3
    big = [(0,) * d for d in range(1, 9)] + [(1,)]  # 9 nodes: more than a chain's 7
    assert SpeculativeConfig(method="draft_model", model="m", speculative_token_tree=big).num_speculative_tokens == 9
    with pytest.raises(ValueError, match="num_speculative_tokens.*number of nodes"):
        SpeculativeConfig(method="draft_model", model="m", num_speculative_tokens=2, speculative_token_tree=PATHS)
    with pytest.raises(ValueError, match="speculative_token_tree.*not by method 'ngram'"):
        SpeculativeConfig(method="ngram", speculative_token_tree=PATHS)


def _hf_logits(hf: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0, -1].float()


def _oracle_children(hf: torch.nn.Module, request: DraftRequest, drafts: list[int], m: int) -> dict[int, list[int]]:
    """node (-1: root) -> its children's tokens as HF ranks them: the top logits; at temperature, the race's winner
    with the key of the token after the node (seeded_keys of the request's seed and that index), then the top
    logits without it."""
    out = {}
    for node in [-1, *range(m)]:
        kids = TREE.children(node, m)
        if not kids:
            continue
        path = [] if node < 0 else [drafts[a] for a in TREE.ancestors(node)]
        logits = _hf_logits(hf, list(request.token_ids) + path)
        top = logits.topk(len(kids) + 1).indices.tolist()
        if request.temperature == 0:
            out[node] = top[:len(kids)]
            continue
        key = int(seeded_keys([request.seed], [len(request.token_ids) + len(path)])[0])
        probs = (logits / request.temperature).softmax(-1)
        noise = -torch.rand(probs.shape, generator=torch.Generator().manual_seed(key % 2**64)).neg().log1p()
        first = int((probs / noise.clamp(min=torch.finfo(torch.float32).tiny)).argmax())
        out[node] = [first] + [t for t in top if t != first][:len(kids) - 1]
    return out


def _rounds(proposer, hf: torch.nn.Module, temperature: float, limits: dict[str, int]) -> None:  # noqa: ANN001
    """Three rounds of drafts checked against the oracle, each appending a random walk through the tree (often off
    the main chain: stale draft KV) and one more token; the draft cache is written only at the slots of positions
    [0, N - 1 + num_drafts) of some round (the blocks a request was given)."""
    for k_cache, v_cache in proposer.kv_caches:
        k_cache.fill_(SENTINEL)
        v_cache.fill_(SENTINEL)
    blocks, rng, allowed = Blocks(), random.Random(0), set()
    seqs = prompts([5, 9, 3, 6][:len(limits)])
    for _ in range(3):
        reqs = [DraftRequest(rid, list(tokens), blocks.cover(rid, len(tokens) - 1 + limits[rid]), limits[rid],
                             seed=11 if temperature else None, temperature=temperature)
                for rid, tokens in seqs.items()]
        drafts = proposer.propose(reqs, torch.zeros(len(reqs), 8)).tolist()
        for request, got in zip(reqs, drafts):
            m = request.num_drafts
            allowed |= {request.block_ids[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
                        for p in range(len(request.token_ids) - 1 + m)}
            assert len(got) == m
            for node, tokens in _oracle_children(hf, request, got, m).items():
                assert [got[c] for c in TREE.children(node, m)] == tokens, (request.req_id, node)
            node, walk = rng.choice(TREE.children(-1, m)), []
            while node is not None:
                walk.append(got[node])
                node = rng.choice(TREE.children(node, m) or [None])
            seqs[request.req_id] = list(request.token_ids) + walk + [rng.randrange(3, 256)]
    for cache in (c for pair in proposer.kv_caches for c in pair):
        outside = torch.ones(cache.shape[0] * cache.shape[1], dtype=torch.bool)
        outside[sorted(allowed)] = False
        assert bool((cache.flatten(0, 1)[outside] == SENTINEL).all())


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tree_drafts_are_the_draft_models_ranked_tokens(dirs, hf_draft, temperature: float) -> None:  # noqa: F811
    proposer = make_proposer(dirs)
    proposer.tree = TREE
    _rounds(proposer, hf_draft, temperature, {"r0": 7, "r1": 4, "r2": 6})


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_captured_tree_loop_drafts_what_hf_does(dirs, temperature: float,  # noqa: F811
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """compile_and_capture with a tree (EagerGraph on CPU, every Triton kernel a GPU would run under the interpreter:
    the fused ops too, whose asserts a GPU meets; TreeMask rows in the decode kernel): one replay drafts what the
    oracle ranks, in a bucket with a padding row, for rows whose limits stop inside the tree (their nodes past it
    store nothing)."""
    import tests.kernels.conftest  # noqa: F401 - TRITON_INTERPRET=1 and the interpreter fixes
    from lamina.graphs import EagerGraph
    from lamina.layers import dispatch
    from lamina.loader.hf_config import load_model_arch
    from lamina.spec.draft_model import DraftModelProposer
    from lamina.spec.tree_loop import TreeLoop
    from tests.helpers.hf_oracle import load_hf
    from tests.spec.test_draft_model import NUM_BLOCKS
    monkeypatch.setattr(dispatch, "on_kernel_device", lambda x: True)
    target = load_model_arch(str(dirs["target"]))
    proposer = DraftModelProposer(str(dirs["head32"]), target, torch.float32, torch.device("cpu"), "triton",
                                  tree=TREE)
    proposer.bind_cache(NUM_BLOCKS, BLOCK_SIZE)
    proposer.compile_and_capture(max_batch_size=4, max_model_len=64, num_drafts=TREE.size, warm_up=None,
                                 graph_cls=EagerGraph)
    assert isinstance(proposer.loop, TreeLoop)
    replays = []
    run = proposer.loop.run
    proposer.loop.run = lambda *a, **k: replays.append(1) or run(*a, **k)
    _rounds(proposer, load_hf(str(dirs["head32"])), temperature, {"r0": 7, "r1": 4, "r2": 6})
    assert len(replays) == 3
