"""`lamina distill` on a tiny random teacher, CPU, a few steps: losses, training loop, checkpoint, CLI."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from lamina.distill.checkpoint import build_model, save_checkpoint  # noqa: E402
from lamina.distill.cli import register  # noqa: E402
from lamina.distill.config import TrainConfig  # noqa: E402
from lamina.distill.data import TokenData, WindowSampler, eval_windows, write_token_data  # noqa: E402
from lamina.distill.evaluate import greedy_agreement, perplexity  # noqa: E402
from lamina.distill.losses import distill_loss, kl_to_teacher  # noqa: E402
from lamina.distill.trainer import Trainer, lr_at  # noqa: E402

VOCAB = 64
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 64, "tie_word_embeddings": True}


def _stream(n: int, seed: int) -> np.ndarray:
    """A learnable stream: counting runs mod 16 from random starts, eos (0) between 'documents'."""
    rng = np.random.default_rng(seed)
    parts = []
    while sum(len(p) for p in parts) < n:
        start, length = rng.integers(1, 16), rng.integers(5, 40)
        parts += [1 + (start + np.arange(length)) % 16, np.array([0])]
    return np.concatenate(parts)[:n].astype(np.uint16)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("distill")
    write_token_data(root / "data", _stream(20_000, 0), _stream(2_000, 1), VOCAB, 0)
    teacher = build_model({**TINY, "hidden_size": 48, "num_hidden_layers": 2}, VOCAB, seed=1)
    save_checkpoint(teacher, root / "teacher", None, eos_token_ids=[0])
    (root / "student.json").write_text(json.dumps(TINY))
    return root


def test_kl_is_zero_for_identical_logits_and_positive_otherwise() -> None:
    logits = torch.randn(2, 5, VOCAB)
    assert kl_to_teacher(logits, logits, 1.0).abs() < 1e-5
    assert kl_to_teacher(torch.randn(2, 5, VOCAB), logits, 2.0) > 0
    total, kl, ce = distill_loss(logits, logits + 1.0, torch.zeros(2, 5, dtype=torch.long), 0.5, 0.25, 1.0)
    assert torch.allclose(total, 0.5 * kl + 0.25 * ce)
    with pytest.raises(ValueError, match="same shape"):
        kl_to_teacher(logits, logits[..., :-1], 1.0)


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        TrainConfig(batch_size=0)
    with pytest.raises(ValueError, match="kl_weight and ce_weight"):
        TrainConfig(kl_weight=0.0, ce_weight=0.0)
    with pytest.raises(ValueError, match="warmup_steps"):
        TrainConfig(time_budget_s=10, warmup_steps=5)


def test_lr_schedule_warms_up_then_decays() -> None:
    cfg = TrainConfig(lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, 100, cfg) == pytest.approx(0.1)
    assert lr_at(9, 100, cfg) == pytest.approx(1.0)
    assert lr_at(100, 100, cfg) == pytest.approx(0.1)


def test_sampler_is_seeded_and_shifts_targets(workdir: Path) -> None:
    data = TokenData.load(workdir / "data")
    a = WindowSampler(data.train, 16, 4, torch.device("cpu"), seed=3).next_batch()
    b = WindowSampler(data.train, 16, 4, torch.device("cpu"), seed=3).next_batch()
    assert torch.equal(a[0], b[0]) and torch.equal(a[0][:, 1:], a[1][:, :-1])
    windows = eval_windows(data.heldout, 16)
    assert torch.equal(windows[0, -1], windows[1, 0])


def test_cross_entropy_training_learns_the_stream(workdir: Path) -> None:
    data = TokenData.load(workdir / "data")
    student = build_model(TINY, VOCAB, seed=0)
    before = perplexity(student, data.heldout, 32)["perplexity"]
    cfg = TrainConfig(steps=60, batch_size=8, seq_len=32, lr=1e-2, warmup_steps=5, kl_weight=0.0, ce_weight=1.0,
                      device="cpu", log_every=10)
    result = Trainer(student, None, data.train, cfg).run(progress=False)
    assert result.steps == 60 and result.tokens == 60 * 8 * 32
    assert result.curve[-1][2] < 0.6 * result.curve[0][2]
    assert perplexity(student, data.heldout, 32)["perplexity"] < 0.5 * before


def test_time_budget_plans_the_step_count(workdir: Path) -> None:
    data = TokenData.load(workdir / "data")
    cfg = TrainConfig(steps=10_000, time_budget_s=1.0, batch_size=2, seq_len=16, warmup_steps=20,
                      kl_weight=0.0, ce_weight=1.0, device="cpu", log_every=5)
    result = Trainer(build_model(TINY, VOCAB, seed=0), None, data.train, cfg).run(progress=False)
    assert cfg.probe_steps + 2 <= result.steps < 10_000


def test_agreement_of_a_model_with_itself_is_total(workdir: Path) -> None:
    data = TokenData.load(workdir / "data")
    model = build_model(TINY, VOCAB, seed=0).eval()
    stats = greedy_agreement(model, model, data.heldout, k=4, positions=16, context_len=8, batch_size=8)
    assert stats.mean_accepted == 4 and stats.tokens_per_step == 5 and stats.accepted_hist[-1] == 1.0


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lamina")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_distill_cli_writes_a_loadable_checkpoint(workdir: Path) -> None:
    out = workdir / "student"
    args = _parse([
        "distill", "--teacher", str(workdir / "teacher"), "--student-config", str(workdir / "student.json"),
        "--data", str(workdir / "data"), "--out", str(out), "--steps", "40", "--batch-size", "8",
        "--seq-len", "32", "--lr", "1e-2", "--warmup-steps", "5", "--log-every", "5", "--eval-tokens", "500",
        "--agreement-positions", "16", "--device", "cpu", "--no-progress",
    ])
    assert args.func(args) == 0
    summary = json.loads((out / "distill_summary.json").read_text())
    curve = summary["curve"]
    assert curve[-1][3] < 0.7 * curve[0][3]  # the KL to the teacher went down
    assert summary["eval"]["agreement"]["k"] == 4 and "perplexity" in summary["eval"]["student"]
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [0]
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert model.config.num_hidden_layers == 1 and model.config.vocab_size == VOCAB
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert all(f.get_tensor(k).dtype == torch.bfloat16 for k in f.keys())


def test_distill_cli_rejects_a_vocabulary_mismatch(workdir: Path) -> None:
    (workdir / "bad.json").write_text(json.dumps({**TINY, "vocab_size": VOCAB + 1}))
    args = _parse(["distill", "--teacher", str(workdir / "teacher"), "--student-config", str(workdir / "bad.json"),
                   "--data", str(workdir / "data"), "--out", str(workdir / "bad"), "--device", "cpu"])
    with pytest.raises(ValueError, match="vocab_size"):
        args.func(args)
