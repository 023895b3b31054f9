"""`lamina distill --method eagle` on a tiny target trained on a counting stream (CPU, a few steps), and the
training-time-test unroll's attention (each chain sees its verified prefix and its own drafts, nothing else)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from lamina.attention.metadata import prefill_metadata, set_attention_metadata  # noqa: E402
from lamina.distill.eagle_ttt import unroll  # noqa: E402
from lamina.kv.cache import allocate_kv_caches, bind_kv_caches  # noqa: E402
from lamina.loader.hf_config import load_model_arch  # noqa: E402
from lamina.loader.model_loader import load_model  # noqa: E402
from lamina.spec.eagle import EagleProposer  # noqa: E402
from lamina.spec.eagle_head import EagleHead, EagleHeadConfig  # noqa: E402
from lamina.spec.model_proposer import DraftRequest  # noqa: E402
from tests.distill.counting import counting_workdir, parse_distill  # noqa: E402
from tests.distill.test_distill import TINY, VOCAB  # noqa: E402

SEQ = 32
TARGET = {**TINY, "num_hidden_layers": 4}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory and a 4-layer target that has learnt to count."""
    return counting_workdir(tmp_path_factory.mktemp("eagle"), TARGET, SEQ)


def test_a_chain_sees_its_prefix_and_its_own_drafts_only() -> None:
    """Changing the features / tokens at positions after base p changes no output of base p at any step."""
    torch.manual_seed(0)
    cfg = EagleHeadConfig(32, 2, 1, 16, 64, (0, 1, 2), max_position_embeddings=64)
    head, embed = EagleHead(cfg), torch.nn.Embedding(VOCAB, 32)
    feats, tokens = torch.randn(1, 12, 96), [torch.randint(0, VOCAB, (1, 12)) for _ in range(3)]
    outs = unroll(head, embed, feats, tokens)
    feats2, tokens2 = feats.clone(), [t.clone() for t in tokens]
    feats2[:, 6:] += 1.0
    for t in tokens2:
        t[:, 6:] = (t[:, 6:] + 1) % VOCAB
    outs2 = unroll(head, embed, feats2, tokens2)
    for a, b in zip(outs, outs2):
        torch.testing.assert_close(a[:, :6], b[:, :6])
        assert not torch.allclose(a[:, 6:], b[:, 6:])
    # a later step depends on the step before it (its own features), not only on step 0
    tokens3 = [tokens[0], tokens[1], tokens[2]]
    feats3 = feats.clone()
    feats3[:, 3] += 1.0
    assert not torch.allclose(unroll(head, embed, feats3, tokens3)[2][:, 3], outs[2][:, 3])


def test_eagle_cli_lowers_the_loss_and_writes_a_loadable_head(workdir: Path) -> None:
    out = workdir / "head"
    args = parse_distill([
        "distill", "--method", "eagle", "--teacher", str(workdir / "target"), "--data", str(workdir / "data"),
        "--out", str(out), "--ttt-steps", "2", "--steps", "60", "--batch-size", "8", "--seq-len", str(SEQ),
        "--train-tokens", "8000", "--lr", "1e-2", "--warmup-steps", "5", "--log-every", "10",
        "--eval-tokens", "1000", "--agreement-positions", "0", "--device", "cpu", "--no-progress",
    ])
    assert args.func(args) == 0
    summary = json.loads((out / "distill_summary.json").read_text())
    curve = summary["curve"]
    assert curve[-1][2] < 0.5 * curve[0][2]
    held = summary["eval"]["heldout"]
    assert len(held["top1"]) == 2 and held["top1"][0] > 0.6 and held["mean_accepted"] > 0.6
    config = json.loads((out / "config.json").read_text())
    assert config["aux_hidden_state_layers"] == [2, 2, 1] and config["hidden_size"] == TINY["hidden_size"]
    target = load_model(str(workdir / "target"), load_model_arch(str(workdir / "target")), torch.float32, "cpu")
    proposer = EagleProposer(str(out), target, torch.float32, "cpu")
    proposer.bind_cache(8, 16)
    bind_kv_caches(target, allocate_kv_caches(target.arch, 8, 16, torch.float32, "cpu"))
    tokens = [3, 4, 5, 6, 7, 8]
    metadata = prefill_metadata([5], 16)  # the target computes positions 0 .. 4 in block 1: the head's features
    with torch.no_grad(), set_attention_metadata(metadata):
        target(torch.tensor(tokens[:5]), torch.arange(5))
    request = DraftRequest("a", tokens, metadata.block_tables[0].tolist(), 3)
    drafts = proposer.propose([request], torch.zeros(1, 1)).tolist()
    assert len(drafts[0]) == 3


def test_bad_options_are_value_errors(workdir: Path) -> None:
    args = parse_distill(["distill", "--method", "eagle", "--teacher", str(workdir / "target"), "--data",
                          str(workdir / "data"), "--out", str(workdir / "x"), "--ttt-steps", "0", "--device", "cpu"])
    with pytest.raises(ValueError, match="--ttt-steps must be >= 1"):
        args.func(args)


def test_online_windows_train_the_head_as_well_as_cached_ones(workdir: Path) -> None:
    """--online: fresh windows through the target every step (mixed with the cached self-generated
    continuations) teach the head to count as the cached windows do."""
    out = workdir / "head-online"
    args = parse_distill([
        "distill", "--method", "eagle", "--teacher", str(workdir / "target"), "--data", str(workdir / "data"),
        "--out", str(out), "--ttt-steps", "2", "--steps", "60", "--batch-size", "8", "--seq-len", str(SEQ),
        "--online", "--train-tokens", "6000", "--self-generated", "2000", "--lr", "1e-2", "--warmup-steps", "5",
        "--log-every", "10", "--eval-tokens", "1000", "--agreement-positions", "0", "--device", "cpu",
        "--no-progress",
    ])
    assert args.func(args) == 0
    summary = json.loads((out / "distill_summary.json").read_text())
    train = summary["train"]
    # 6 of 8 windows a step fresh (6000 / (6000 + 2000)), the other 2 cached: the continuations of
    # ceil(2000 / (SEQ / 2)) prompts, SEQ positions each (prompt half + generated half); no train.bin cache
    assert train["online_positions"] == 6 * SEQ * 60
    assert train["positions_cached"] == -(-2000 // (SEQ // 2)) * SEQ
    assert summary["curve"][-1][2] < 0.5 * summary["curve"][0][2]
    held = summary["eval"]["heldout"]
    assert held["top1"][0] > 0.6 and held["mean_accepted"] > 0.6
