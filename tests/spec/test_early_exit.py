"""EarlyExitProposer against HF truncated to its first L' layers, greedy-continued from each request's tokens.

The target's KV for positions [0, N - 1) is filled by a full forward over each request's tokens but the
newest; the proposer then drafts for a batch of requests with different lengths and draft counts, through
shuffled block tables. Every KV slot starts as a sentinel, so writes outside [N - 1, N - 1 + k) of the
first L' layers (or to blocks not given) show.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from lamina import DEMO_MODEL
from lamina.attention.metadata import set_attention_metadata
from lamina.config import ModelArch
from lamina.kv.cache import KVCache, allocate_kv_caches, bind_kv_caches
from lamina.loader.hf_config import load_model_arch
from lamina.loader.model_loader import load_model
from lamina.loader.tokenizer import Tokenizer
from lamina.models.common import CausalLM
from lamina.spec.early_exit import EarlyExitProposer, resolve_exit_layer
from lamina.spec.model_proposer import DraftRequest, ModelProposer
from tests.helpers.hf_oracle import hf_greedy, load_hf
from tests.helpers.paged import build_metadata
from tests.helpers.tiny_models import make_tiny_model
from tests.models.test_forward_layers import truncated_hf

BLOCK_SIZE = 4
NUM_BLOCKS = 48
SENTINEL = 123.0
NUM_LAYERS = 4


@dataclass
class Target:
    path: str
    arch: ModelArch
    model: CausalLM
    hf: torch.nn.Module


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Target:
    path = str(make_tiny_model("llama", tmp_path_factory.mktemp("t"), num_hidden_layers=NUM_LAYERS))
    arch = load_model_arch(path)
    return Target(path, arch, load_model(path, arch, torch.float32, "cpu"), load_hf(path))


def make_requests(lengths: list[int], num_drafts: list[int], seed: int = 0) -> list[DraftRequest]:
    """Requests with random tokens and shuffled block ids (from 1: block 0 is the null block), some spare."""
    rng = random.Random(seed)
    pool = list(range(1, NUM_BLOCKS))
    rng.shuffle(pool)
    requests = []
    for i, (n, k) in enumerate(zip(lengths, num_drafts)):
        num_blocks = -(-(n - 1 + k) // BLOCK_SIZE)
        blocks, pool = pool[:num_blocks], pool[num_blocks:]
        requests.append(DraftRequest(f"r{i}", [rng.randrange(256) for _ in range(n)], blocks, k))
    return requests


def bind_sentinel_cache(target: Target) -> list[KVCache]:
    caches = allocate_kv_caches(target.arch, NUM_BLOCKS, BLOCK_SIZE, torch.float32, "cpu")
    for k, v in caches:
        k.fill_(SENTINEL)
        v.fill_(SENTINEL)
    bind_kv_caches(target.model, caches)
    return caches


@torch.inference_mode()
def run_target(model: CausalLM, requests: list[DraftRequest], chunks: list[tuple[list[int], int]]) -> None:
    """One full forward; chunks[i] = (tokens, first position) of requests[i] (empty chunks skipped)."""
    seqs, ids, positions = [], [], []
    for request, (tokens, start) in zip(requests, chunks):
        if tokens:
            seqs.append((request.block_ids, start, len(tokens)))
            ids += tokens
            positions += range(start, start + len(tokens))
    with set_attention_metadata(build_metadata(seqs, BLOCK_SIZE)):
        model(torch.tensor(ids), torch.tensor(positions))


def prefill(target: Target, requests: list[DraftRequest]) -> None:
    """The target's KV for positions [0, N - 1) of every request."""
    run_target(target.model, requests, [(list(r.token_ids[:-1]), 0) for r in requests])


def drafted_slots(requests: list[DraftRequest]) -> torch.Tensor:
    """[NUM_BLOCKS, BLOCK_SIZE] bool: the slots of positions [N - 1, N - 1 + k), the only ones drafting writes."""
    mask = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, dtype=torch.bool)
    for r in requests:
        for pos in range(len(r.token_ids) - 1, len(r.token_ids) - 1 + r.num_drafts):
            mask[r.block_ids[pos // BLOCK_SIZE], pos % BLOCK_SIZE] = True
    return mask


def oracle(hf: torch.nn.Module, exit_layer: int, requests: list[DraftRequest]) -> list[list[int]]:
    short = truncated_hf(hf, exit_layer)
    return [hf_greedy(short, list(r.token_ids), r.num_drafts) for r in requests]


LENGTHS, NUM_DRAFTS = [2, 7, 13, 9, 4], [3, 1, 5, 2, 4]


@pytest.mark.parametrize("exit_layer", [1, NUM_LAYERS - 1])
def test_drafts_match_truncated_hf_in_one_batch(target: Target, exit_layer: int) -> None:
    requests = make_requests(LENGTHS, NUM_DRAFTS, seed=exit_layer)
    bind_sentinel_cache(target)
    prefill(target, requests)
    proposer = EarlyExitProposer(target.model, exit_layer, BLOCK_SIZE)
    drafts = proposer.propose(requests, torch.zeros(len(requests), target.arch.hidden_size)).tolist()
    assert [len(d) for d in drafts] == NUM_DRAFTS
    assert drafts == oracle(target.hf, exit_layer, requests)


def test_writes_only_drafted_slots_of_first_layers(target: Target) -> None:
    exit_layer = 2
    requests = make_requests(LENGTHS, NUM_DRAFTS, seed=7)
    caches = bind_sentinel_cache(target)
    prefill(target, requests)
    before = [(k.clone(), v.clone()) for k, v in caches]
    EarlyExitProposer(target.model, exit_layer, BLOCK_SIZE).propose(requests, torch.empty(0)).tolist()
    written = drafted_slots(requests)
    for layer, ((k, v), (k0, v0)) in enumerate(zip(caches, before)):
        untouched = ~written if layer < exit_layer else torch.ones_like(written)
        assert torch.equal(k[untouched], k0[untouched]) and torch.equal(v[untouched], v0[untouched]), layer
        if layer < exit_layer:  # the drafted positions were really written
            assert not (k[written] == SENTINEL).all(dim=-1).any()


def test_drafted_kv_is_what_the_verifier_writes(target: Target) -> None:
    """The first layers' KV at [N - 1, N - 1 + k) equals what the full target writes for the same tokens,
    so the verifier's rewrite is the only bookkeeping (no rollback)."""
    exit_layer = 2
    requests = make_requests(LENGTHS, NUM_DRAFTS, seed=3)
    caches = bind_sentinel_cache(target)
    prefill(target, requests)
    drafts = EarlyExitProposer(target.model, exit_layer, BLOCK_SIZE).propose(requests, torch.empty(0)).tolist()
    drafted = [(k.clone(), v.clone()) for k, v in caches[:exit_layer]]
    run_target(target.model, requests, [([r.token_ids[-1]] + d[:-1], len(r.token_ids) - 1)
                                        for r, d in zip(requests, drafts)])
    written = drafted_slots(requests)
    for (k, v), (k1, v1) in zip(caches[:exit_layer], drafted):
        torch.testing.assert_close(k1[written], k[written], atol=1e-5, rtol=0)
        torch.testing.assert_close(v1[written], v[written], atol=1e-5, rtol=0)


def test_is_a_model_proposer_without_kv(target: Target) -> None:
    proposer = EarlyExitProposer(target.model, None, BLOCK_SIZE)
    assert isinstance(proposer, ModelProposer)
    assert proposer.exit_layer == 1  # a third of 4 layers
    assert proposer.kv_bytes_per_block(BLOCK_SIZE) == 0
    proposer.bind_cache(NUM_BLOCKS, BLOCK_SIZE)
    proposer.forget(["r0"])
    assert proposer.propose([], torch.empty(0)).tolist() == []


@pytest.mark.parametrize("exit_layer", [0, -1, NUM_LAYERS, NUM_LAYERS + 1])
def test_exit_layer_out_of_range_is_a_value_error(target: Target, exit_layer: int) -> None:
    with pytest.raises(ValueError, match=r"speculative_config\.exit_layer must be in \[1, 3\]"):
        EarlyExitProposer(target.model, exit_layer, BLOCK_SIZE)


def test_default_exit_layer() -> None:
    assert [resolve_exit_layer(None, n) for n in (2, 3, 9, 28)] == [1, 1, 3, 9]
    with pytest.raises(ValueError, match="exit_layer"):
        resolve_exit_layer(None, 1)  # one layer: nothing to exit early from


def test_blocks_not_covering_the_drafts_are_a_value_error(target: Target) -> None:
    request = DraftRequest("short", list(range(8)), [1, 2], 2)  # needs positions [0, 9): 3 blocks of 4
    with pytest.raises(ValueError, match="do not cover"):
        EarlyExitProposer(target.model, 1, BLOCK_SIZE).propose([request], torch.empty(0)).tolist()


def test_demo_model_matches_truncated_hf() -> None:
    arch = load_model_arch(DEMO_MODEL)
    model = load_model(DEMO_MODEL, arch, torch.float32, "cpu")
    tokens = Tokenizer.from_pretrained(DEMO_MODEL).encode("Once upon a time, a little girl named Lily")
    block_size, num_drafts = 16, 5
    bind_kv_caches(model, allocate_kv_caches(arch, 8, block_size, torch.float32, "cpu"))
    num_blocks = -(-(len(tokens) - 1 + num_drafts) // block_size)
    request = DraftRequest("demo", tokens, list(range(1, num_blocks + 1)), num_drafts)
    with set_attention_metadata(build_metadata([(request.block_ids, 0, len(tokens) - 1)], block_size)), \
            torch.inference_mode():
        model(torch.tensor(tokens[:-1]), torch.arange(len(tokens) - 1))
    proposer = EarlyExitProposer(model, None, block_size)
    assert proposer.exit_layer == 3  # a third of 9
    assert proposer.propose([request], torch.empty(0)).tolist() == oracle(load_hf(DEMO_MODEL), 3, [request])


def test_the_captured_draft_loop_drafts_what_the_eager_path_does(target: Target) -> None:
    """compile_and_capture (EagerGraph on CPU, the Triton kernels under the interpreter, as a CUDA graph runs them):
    one replay per call gives truncated HF's greedy drafts for mixed lengths and draft counts in a bucket with
    padding rows, and writes only the drafted slots of the first layers."""
    import tests.kernels.conftest  # noqa: F401 - TRITON_INTERPRET=1 and the interpreter fixes
    from lamina.graphs import EagerGraph

    exit_layer = 2
    model = load_model(target.path, target.arch, torch.float32, "cpu", attention_backend="triton")
    graphed = Target(target.path, target.arch, model, target.hf)
    caches = bind_sentinel_cache(graphed)  # bound once, before the capture (a CUDA graph keeps its addresses)
    proposer = EarlyExitProposer(model, exit_layer, BLOCK_SIZE)
    proposer.compile_and_capture(max_batch_size=8, max_model_len=64, num_drafts=5, warm_up=None,
                                 graph_cls=EagerGraph)
    for seed in (11, 12):
        requests = make_requests(LENGTHS, NUM_DRAFTS, seed=seed)
        for k, v in caches:
            k.fill_(SENTINEL)
            v.fill_(SENTINEL)
        prefill(graphed, requests)
        before = [(k.clone(), v.clone()) for k, v in caches]
        drafts = proposer.propose(requests, torch.empty(0)).tolist()
        assert drafts == oracle(target.hf, exit_layer, requests)
        written = drafted_slots(requests)
        for layer, ((k, v), (k0, v0)) in enumerate(zip(caches, before)):
            untouched = ~written if layer < exit_layer else torch.ones_like(written)
            assert torch.equal(k[untouched], k0[untouched]) and torch.equal(v[untouched], v0[untouched]), layer
