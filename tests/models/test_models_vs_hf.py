"""lamina's logits against HF transformers' on tiny random checkpoints, through the paged KV cache.

Every architecture: a whole prompt, the same prompt in chunks (later chunks read the cached
prefix), decode steps after a prefill, and a flat batch mixing prefills and decodes of different
sequences. HF runs the whole sequence without a cache, so it is an independent oracle.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from lamina.config import ModelArch
from lamina.loader.hf_config import load_model_arch
from lamina.loader.model_loader import load_model
from lamina.models.common import CausalLM
from tests.helpers.hf_oracle import load_hf
from tests.helpers.paged import PagedRunner
from tests.helpers.tiny_models import KINDS, make_tiny_model

ATOL = 1e-4
CPU = torch.device("cpu")


@dataclass
class Tiny:
    path: str
    arch: ModelArch
    model: CausalLM
    hf: torch.nn.Module

    def runner(self) -> PagedRunner:
        return PagedRunner(self.model, self.arch, block_size=4, num_blocks=96)

    @torch.no_grad()
    def hf_logits(self, tokens: list[int]) -> torch.Tensor:
        return self.hf(torch.tensor([tokens])).logits[0].float()


def tokens(seed: int, n: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module", params=KINDS)
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    path = str(make_tiny_model(request.param, tmp_path_factory.mktemp(request.param)))
    arch = load_model_arch(path)
    return Tiny(path, arch, load_model(path, arch, torch.float32, CPU), load_hf(path))


def test_whole_prompt_matches_hf(tiny: Tiny) -> None:
    prompt = tokens(0, 37)  # 37 = 9 full blocks of 4 + a partial one
    out = tiny.runner().step({"a": prompt})["a"]
    assert out.dtype == torch.float32 and out.shape == (37, tiny.arch.vocab_size)
    torch.testing.assert_close(out, tiny.hf_logits(prompt), atol=ATOL, rtol=0)


def test_chunked_prefill_matches_hf(tiny: Tiny) -> None:
    prompt = tokens(1, 37)
    runner = tiny.runner()
    # Chunk edges inside blocks and on block boundaries.
    pieces = [runner.step({"a": prompt[lo:hi]})["a"] for lo, hi in [(0, 13), (13, 16), (16, 29), (29, 37)]]
    torch.testing.assert_close(torch.cat(pieces), tiny.hf_logits(prompt), atol=ATOL, rtol=0)


def test_decode_steps_after_prefill_match_hf(tiny: Tiny) -> None:
    seq = tokens(2, 28)
    runner = tiny.runner()
    outs = [runner.step({"a": seq[:20]})["a"]]
    outs += [runner.step({"a": [tok]})["a"] for tok in seq[20:]]  # q_len 1, teacher-forced
    torch.testing.assert_close(torch.cat(outs), tiny.hf_logits(seq), atol=ATOL, rtol=0)


def test_mixed_batch_of_prefills_and_decodes_matches_hf(tiny: Tiny) -> None:
    a, b, c = tokens(3, 12), tokens(4, 8), tokens(5, 9)
    runner = tiny.runner()
    first = runner.step({"a": a[:11], "b": b[:7]})
    # One flat forward: two decodes and a fresh prefill, in an order that interleaves them.
    second = runner.step({"a": a[11:], "c": c, "b": b[7:]})
    torch.testing.assert_close(torch.cat([first["a"], second["a"]]), tiny.hf_logits(a), atol=ATOL, rtol=0)
    torch.testing.assert_close(torch.cat([first["b"], second["b"]]), tiny.hf_logits(b), atol=ATOL, rtol=0)
    torch.testing.assert_close(second["c"], tiny.hf_logits(c), atol=ATOL, rtol=0)


def test_batch_of_three_equals_each_alone(tiny: Tiny) -> None:
    seqs = {"x": tokens(6, 5), "y": tokens(7, 23), "z": tokens(8, 11)}
    together = tiny.runner().step(seqs)
    for name, seq in seqs.items():
        alone = tiny.runner().step({name: seq})[name]
        torch.testing.assert_close(together[name], alone, atol=1e-5, rtol=0)
