"""DraftModelProposer against HF transformers' greedy continuation of the draft checkpoint (no KV cache to trust):
batched first drafts, verification rounds that accept and reject drafts (stale draft KV), mixed num_drafts,
forget + new block ids, KV writes confined to the given blocks, the position limit, validation, the demo pair."""
from __future__ import annotations

import random
from pathlib import Path
from types import ModuleType

import pytest
import torch
from tokenizers import Tokenizer

import lamina
from lamina.kv.cache import kv_cache_bytes_per_block
from lamina.layers.sampling_metadata import philox_keys
from lamina.loader.hf_config import load_model_arch
from lamina.spec.draft_loop import WIDE_TOKENS, DraftLoops, ModelNet
from lamina.spec.draft_model import DraftModelProposer
from lamina.spec.model_proposer import DraftRequest, ModelProposer
from tests.helpers.hf_oracle import hf_greedy, load_hf
from tests.helpers.tiny_models import make_tiny_model

BLOCK_SIZE, NUM_BLOCKS = 4, 96
DRAFT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, head_dim=8)
SENTINEL = 7.0


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("draft_model")
    return {"target": make_tiny_model("llama", root / "target"),
            "draft": make_tiny_model("llama", root / "draft", seed=3, **DRAFT),
            "short": make_tiny_model("llama", root / "short", seed=3, max_position_embeddings=16, **DRAFT),
            "other_vocab": make_tiny_model("llama", root / "other_vocab", vocab_size=128, **DRAFT),
            "head32": make_tiny_model("llama", root / "head32", seed=3, hidden_size=64, intermediate_size=64,
                                      num_hidden_layers=1, head_dim=32, num_attention_heads=2, num_key_value_heads=1)}


@pytest.fixture(scope="module")
def hf_draft(dirs: dict[str, Path]) -> torch.nn.Module:
    return load_hf(str(dirs["draft"]))


def make_proposer(dirs: dict[str, Path], name: str = "draft") -> DraftModelProposer:
    target = load_model_arch(str(dirs["target"]))
    proposer = DraftModelProposer(str(dirs[name]), target, torch.float32, torch.device("cpu"), "torch")
    proposer.bind_cache(NUM_BLOCKS, BLOCK_SIZE)
    return proposer


class Blocks:
    """Hands out shuffled block ids (never 0) and grows each request's table to cover its lookahead."""

    def __init__(self, seed: int = 0, first: int = 1, last: int = NUM_BLOCKS) -> None:
        self.free = list(range(first, last))
        random.Random(seed).shuffle(self.free)
        self.tables: dict[str, list[int]] = {}

    def cover(self, req_id: str, num_positions: int) -> list[int]:
        table = self.tables.setdefault(req_id, [])
        while len(table) * BLOCK_SIZE < num_positions:
            table.append(self.free.pop())
        return table


def requests(seqs: dict[str, list[int]], num_drafts: dict[str, int], blocks: Blocks) -> list[DraftRequest]:
    return [DraftRequest(rid, list(tokens), blocks.cover(rid, len(tokens) - 1 + num_drafts[rid]), num_drafts[rid])
            for rid, tokens in seqs.items()]


def propose(proposer: DraftModelProposer, reqs: list[DraftRequest]) -> list[list[int]]:
    return proposer.propose(reqs, torch.zeros(len(reqs), 64)).tolist()


def prompts(lengths: list[int], seed: int = 0) -> dict[str, list[int]]:
    rng = random.Random(seed)
    return {f"r{i}": [rng.randrange(3, 256) for _ in range(n)] for i, n in enumerate(lengths)}


def verify(tokens: list[int], drafts: list[int], rng: random.Random, hf: torch.nn.Module) -> list[int]:
    """The tokens verified since the last propose: some drafts accepted, then a token that is not the next draft,
    sometimes followed by plain decode steps (the draft KV of positions before the newest token is then stale)."""
    accepted = rng.randrange(len(drafts) + 1)
    if accepted == len(drafts):
        return [*drafts, hf_greedy(hf, tokens + drafts, 1)[0]]  # all accepted, plus a bonus token
    rejected = (drafts[accepted] + 1 + rng.randrange(200)) % 256
    return [*drafts[:accepted], rejected, *(rng.randrange(3, 256) for _ in range(rng.randrange(3)))]


def test_is_a_model_proposer(dirs: dict[str, Path]) -> None:
    proposer = make_proposer(dirs)
    assert isinstance(proposer, ModelProposer)
    assert proposer.kv_bytes_per_block(16) == kv_cache_bytes_per_block(proposer.arch, 16, torch.float32)
    assert proposer.kv_bytes_per_block(16) == 2 * 1 * 16 * 2 * 8 * 4


def test_batched_drafts_match_hf_through_verification_rounds(dirs: dict[str, Path], hf_draft: torch.nn.Module
                                                           ) -> None:
    proposer, blocks, rng = make_proposer(dirs), Blocks(), random.Random(1)
    seqs = prompts([1, 5, 13, 8])
    k = {rid: 4 for rid in seqs}
    for _ in range(5):
        drafts = propose(proposer, requests(seqs, k, blocks))
        for (rid, tokens), got in zip(seqs.items(), drafts):
            assert got == hf_greedy(hf_draft, tokens, 4), rid
        for rid, got in zip(seqs, drafts):
            seqs[rid] = seqs[rid] + verify(seqs[rid], got, rng, hf_draft)


def test_requests_with_different_num_drafts(dirs: dict[str, Path], hf_draft: torch.nn.Module) -> None:
    proposer, blocks, rng = make_proposer(dirs), Blocks(), random.Random(2)
    seqs = prompts([6, 3, 9, 2], seed=1)
    for round_ in range(3):
        k = {rid: 1 + (i + round_) % 4 for i, rid in enumerate(seqs)}
        drafts = propose(proposer, requests(seqs, k, blocks))
        for (rid, tokens), got in zip(seqs.items(), drafts):
            assert got == hf_greedy(hf_draft, tokens, k[rid]), rid
        for rid, got in zip(seqs, drafts):
            seqs[rid] = seqs[rid] + verify(seqs[rid], got, rng, hf_draft)


def test_forget_then_new_block_ids(dirs: dict[str, Path], hf_draft: torch.nn.Module) -> None:
    """A preempted request comes back with other blocks (full of garbage): the proposer must refill them."""
    proposer = make_proposer(dirs)
    seqs = prompts([10], seed=2)
    first = propose(proposer, requests(seqs, {"r0": 3}, Blocks(first=1, last=40)))[0]
    seqs["r0"] += first[:2]
    proposer.forget(["r0", "never-seen"])
    for k_cache, v_cache in proposer.kv_caches:
        k_cache[40:].fill_(SENTINEL)
        v_cache[40:].fill_(-SENTINEL)
    again = propose(proposer, requests(seqs, {"r0": 3}, Blocks(first=40)))[0]
    assert again == hf_greedy(hf_draft, seqs["r0"], 3)


def test_kv_writes_stay_inside_the_given_blocks(dirs: dict[str, Path], hf_draft: torch.nn.Module) -> None:
    proposer, blocks, rng = make_proposer(dirs), Blocks(seed=5), random.Random(3)
    for k_cache, v_cache in proposer.kv_caches:
        k_cache.fill_(SENTINEL)
        v_cache.fill_(SENTINEL)
    seqs = prompts([7, 2, 11], seed=3)
    k = {"r0": 3, "r1": 2, "r2": 4}
    written: set[int] = set()  # slots at positions < N - 1 + num_drafts of some round
    for _ in range(3):
        reqs = requests(seqs, k, blocks)
        drafts = propose(proposer, reqs)
        for req, got in zip(reqs, drafts):
            assert got == hf_greedy(hf_draft, list(req.token_ids), req.num_drafts)
            written |= {req.block_ids[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
                        for p in range(len(req.token_ids) - 1 + req.num_drafts)}
        for rid, got in zip(seqs, drafts):
            seqs[rid] = seqs[rid] + verify(seqs[rid], got, rng, hf_draft)
    for k_cache, v_cache in proposer.kv_caches:
        for cache in (k_cache, v_cache):
            flat = cache.flatten(0, 1)
            untouched = torch.ones(len(flat), dtype=torch.bool)
            untouched[sorted(written)] = False
            assert bool((flat[untouched] == SENTINEL).all())
            assert not bool((flat[sorted(written)] == SENTINEL).all(dim=(1, 2)).any())


def test_drafts_stop_at_the_draft_models_positions(dirs: dict[str, Path]) -> None:
    """max_position_embeddings = 16: the last fed position stays below 16 (module docstring: fewer drafts)."""
    proposer, hf_short = make_proposer(dirs, "short"), load_hf(str(dirs["short"]))
    seqs = prompts([14, 16, 17], seed=4)
    drafts = propose(proposer, requests(seqs, {rid: 5 for rid in seqs}, Blocks()))
    assert [len(d) for d in drafts] == [3, 1, 0]
    assert drafts[0] == hf_greedy(hf_short, seqs["r0"], 3)
    assert drafts[1] == hf_greedy(hf_short, seqs["r1"], 1)


def test_vocab_size_must_match_the_target(dirs: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match=r"speculative_config\.model.*\(128\).*\(256\)"):
        make_proposer(dirs, "other_vocab")
    target = load_model_arch(str(dirs["target"]))
    with pytest.raises(ValueError, match=r"speculative_config\.model.*does not exist"):
        DraftModelProposer(str(dirs["draft"] / "missing"), target, torch.float32, torch.device("cpu"))


def test_demo_draft_matches_hf() -> None:
    target = load_model_arch(lamina.DEMO_MODEL)
    proposer = DraftModelProposer(lamina.DEMO_DRAFT, target, torch.float32, torch.device("cpu"), "torch")
    proposer.bind_cache(16, 16)
    tokenizer = Tokenizer.from_file(str(Path(lamina.DEMO_DRAFT) / "tokenizer.json"))
    prompt = tokenizer.encode("def fibonacci(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.").ids
    request = DraftRequest("demo", prompt, list(range(1, 1 + -(-(len(prompt) + 4) // 16))), 5)
    drafts = proposer.propose([request], torch.zeros(1, 384)).tolist()
    assert drafts == [hf_greedy(load_hf(lamina.DEMO_DRAFT), prompt, 5)]


def test_the_captured_draft_loop_drafts_what_hf_does(dirs: dict[str, Path]) -> None:
    """compile_and_capture (EagerGraph on CPU, the Triton kernels under the interpreter, as a CUDA graph runs them):
    the catch-up and the k - 1 decode steps with device-made inputs give HF's greedy drafts, through rounds of
    verification with mixed num_drafts (rows past their limit store nothing) and a new long prompt (the wide loop:
    its 17 tokens through the prefill kernel, the other rows' through the decode kernel, in one replay; nothing
    fed eagerly), in a bucket with padding rows."""
    import tests.kernels.conftest  # noqa: F401 - TRITON_INTERPRET=1 and the interpreter fixes
    from lamina.graphs import EagerGraph

    target, hf_draft = load_model_arch(str(dirs["target"])), load_hf(str(dirs["head32"]))
    proposer = DraftModelProposer(str(dirs["head32"]), target, torch.float32, torch.device("cpu"), "triton")
    proposer.bind_cache(NUM_BLOCKS, BLOCK_SIZE)
    proposer.compile_and_capture(max_batch_size=4, max_model_len=64, num_drafts=3, warm_up=None, graph_cls=EagerGraph)
    blocks, rng = Blocks(seed=5), random.Random(3)
    seqs = prompts([4, 2, 9], seed=4)
    for round_ in range(4):
        if round_ == 2:
            seqs["late"] = prompts([17], seed=9)["r0"]  # a prompt longer than k + 1 tokens
        k = {rid: 1 + (i + round_) % 3 for i, rid in enumerate(seqs)}
        drafts = propose(proposer, requests(seqs, k, blocks))
        for (rid, tokens), got in zip(seqs.items(), drafts):
            assert got == hf_greedy(hf_draft, tokens, k[rid]), (round_, rid)
        for rid, got in zip(seqs, drafts):
            seqs[rid] = seqs[rid] + verify(seqs[rid], got, rng, hf_draft)
    assert proposer.eager_catch_up_tokens == 0


@pytest.mark.parametrize("wide_tokens", [WIDE_TOKENS, 16])
def test_a_request_back_from_a_plain_stretch_catches_up_in_one_replay(dirs: dict[str, Path], wide_tokens: int
                                                                      ) -> None:
    """A request that did not draft for 20 steps (the gate's plain window, the policy's pause) catches up on them
    in the wide loop's replay; with loops too small for it (wide_tokens 16: one row of 16 tokens) all but its newest
    token are fed eagerly first. Either way the drafts are HF's."""
    import tests.kernels.conftest  # noqa: F401 - TRITON_INTERPRET=1 and the interpreter fixes
    from lamina.graphs import EagerGraph

    target, hf_draft = load_model_arch(str(dirs["target"])), load_hf(str(dirs["head32"]))
    proposer = DraftModelProposer(str(dirs["head32"]), target, torch.float32, torch.device("cpu"), "triton")
    proposer.bind_cache(NUM_BLOCKS, BLOCK_SIZE)
    proposer.loop = DraftLoops(ModelNet(proposer.model), 3, 2, 64, BLOCK_SIZE, torch.device("cpu"), EagerGraph,
                               wide_tokens=wide_tokens)
    proposer.loop.capture_all()
    blocks, seqs = Blocks(seed=8), prompts([3], seed=11)
    assert propose(proposer, requests(seqs, {"r0": 3}, blocks)) == [hf_greedy(hf_draft, seqs["r0"], 3)]
    seqs["r0"] = seqs["r0"] + hf_greedy(hf_draft, seqs["r0"], 20)  # 20 tokens decoded without drafts
    assert propose(proposer, requests(seqs, {"r0": 3}, blocks)) == [hf_greedy(hf_draft, seqs["r0"], 3)]
    # the cache held the prompt and the first call's 2 fed drafts, which the greedy continuation repeats: the catch-up
    # is positions [5, 23); eagerly all but the newest
    assert proposer.eager_catch_up_tokens == (0 if wide_tokens == WIDE_TOKENS else 23 - 1 - 5)


def hf_sampled(hf: torch.nn.Module, tokens: list[int], k: int, seed: int, temperature: float,
               kernel: ModuleType | None = None) -> list[int]:
    """k drafts drawn one by one from HF's distribution at `temperature`, draft j with the noise of the verify row
    that samples token len(tokens) + j: the exponential race of a generator seeded with its key, or (`kernel`: the
    sampling kernel's module) the kernel's Gumbel-max keyed by it. The sampled drafts' oracle."""
    out = list(tokens)
    for j in range(k):
        with torch.no_grad():
            logits = hf(torch.tensor([out])).logits[0, -1:].float()
        key = philox_keys([seed], [len(tokens) + j], step_key=0)[0]
        if kernel is not None:
            out.append(int(kernel.sample(logits, torch.tensor([temperature]), torch.tensor([key]),
                                         top_p=torch.ones(1), min_p=torch.zeros(1))[0]))
            continue
        probs = (logits[0] / temperature).softmax(-1)
        noise = -torch.log1p(-torch.rand(probs.shape, generator=torch.Generator().manual_seed(key % 2**64)))
        out.append(int((probs / noise).argmax()))
    return out[len(tokens):]


@pytest.mark.parametrize("path", ["eager", "captured", "captured-kernel"])
def test_sampled_drafts_follow_the_verify_rows_noise(dirs: dict[str, Path], path: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests with a key and a temperature draw their drafts from the draft model's own distribution with the
    noise of the rows that will verify them (lamina/spec/draft_sampling.py): eagerly and in the captured loop on
    the torch path (CPU), and in the captured loop through the sampling kernel as on CUDA (the interpreter); a
    greedy request beside them keeps its argmax drafts."""
    import tests.kernels.conftest  # noqa: F401 - TRITON_INTERPRET=1 and the interpreter fixes
    from lamina.graphs import EagerGraph

    kernel = None
    if path == "captured-kernel":
        pytest.importorskip("triton")
        from lamina.kernels import sampling as kernel
        monkeypatch.setattr("lamina.spec.draft_sampling.uses_sampling_kernel", lambda device: True)
    target, hf_draft = load_model_arch(str(dirs["target"])), load_hf(str(dirs["head32"]))
    proposer = DraftModelProposer(str(dirs["head32"]), target, torch.float32, torch.device("cpu"), "triton")
    proposer.bind_cache(NUM_BLOCKS, BLOCK_SIZE)
    if path != "eager":
        proposer.compile_and_capture(max_batch_size=4, max_model_len=64, num_drafts=3, warm_up=None,
                                     graph_cls=EagerGraph)
        assert (proposer.loop.narrow.kernels is kernel) and proposer.loop.narrow.sampled
    blocks, seqs = Blocks(seed=2), prompts([3, 6, 2], seed=6)
    sampling = {"r0": (11, 0.8), "r1": (None, 0.0), "r2": (2**64 - 5, 1.2)}  # (seed, temperature)
    for round_ in range(2):
        reqs = [DraftRequest(rid, list(tokens), blocks.cover(rid, len(tokens) + 2), 3, *sampling[rid])
                for rid, tokens in seqs.items()]
        drafts = propose(proposer, reqs)
        for (rid, tokens), got in zip(seqs.items(), drafts):
            seed, temperature = sampling[rid]
            want = (hf_greedy(hf_draft, tokens, 3) if seed is None
                    else hf_sampled(hf_draft, tokens, 3, seed, temperature, kernel))
            assert got == want, (round_, rid)
        seqs = {rid: tokens + drafts[i][:1 + round_] for i, (rid, tokens) in enumerate(seqs.items())}
