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
from tests.spec.test_draft_model import Blocks, dirs, hf_draft, make_proposer, prompts  # noqa: F401 (fixtures)

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
    """node (-1: root) -> its children's tokens as HF ranks them: the top logits, or the race with the key of the
    token after the node (seeded_keys of the request's seed and that index) at the request's temperature."""
    out = {}
    for node in [-1, *range(m)]:
        kids = TREE.children(node, m)
        if not kids:
            continue
        path = [] if node < 0 else [drafts[a] for a in TREE.ancestors(node)]
        logits = _hf_logits(hf, list(request.token_ids) + path)
        if request.temperature == 0:
            out[node] = logits.topk(len(kids)).indices.tolist()
            continue
        index = len(request.token_ids) + len(path)
        key = int(seeded_keys([request.seed], [index])[0])
        probs = (logits / request.temperature).softmax(-1)
        noise = -torch.rand(probs.shape, generator=torch.Generator().manual_seed(key % 2**64)).neg().log1p()
        out[node] = (probs / noise.clamp(min=torch.finfo(torch.float32).tiny)).topk(len(kids)).indices.tolist()
    return out


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tree_drafts_are_the_draft_models_ranked_tokens(dirs, hf_draft, temperature: float) -> None:  # noqa: F811
    proposer = make_proposer(dirs)
    proposer.tree = TREE
    blocks, rng = Blocks(), random.Random(0)
    seqs = prompts([5, 9, 3])
    limits = {"r0": 7, "r1": 4, "r2": 6}
    for _ in range(3):  # rounds: each appends a random walk through the tree and one more token
        reqs = [DraftRequest(rid, list(tokens), blocks.cover(rid, len(tokens) - 1 + limits[rid]), limits[rid],
                             seed=11 if temperature else None, temperature=temperature)
                for rid, tokens in seqs.items()]
        drafts = proposer.propose(reqs, torch.zeros(3, 8)).tolist()
        for request, got in zip(reqs, drafts):
            m = request.num_drafts
            assert len(got) == m
            for node, tokens in _oracle_children(hf_draft, request, got, m).items():
                assert [got[c] for c in TREE.children(node, m)] == tokens, (request.req_id, node)
            node, walk = rng.choice(TREE.children(-1, m)), []
            while node is not None:  # a random path, often off the main chain
                walk.append(got[node])
                node = rng.choice(TREE.children(node, m) or [None])
            seqs[request.req_id] = list(request.token_ids) + walk + [rng.randrange(3, 256)]
