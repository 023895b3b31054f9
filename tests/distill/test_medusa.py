"""`lamina distill --method medusa` on a tiny target trained on a counting stream, CPU, a few steps."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from lamina.distill.config import TrainConfig  # noqa: E402
from lamina.distill.data import TokenData, eval_windows  # noqa: E402
from lamina.distill.medusa import collect, head_accuracy, head_losses  # noqa: E402
from lamina.loader.hf_config import load_model_arch  # noqa: E402
from lamina.loader.model_loader import load_model  # noqa: E402
from lamina.spec.medusa import MedusaHeads, MedusaProposer  # noqa: E402
from lamina.spec.model_proposer import DraftRequest  # noqa: E402
from tests.distill.counting import counting_workdir, parse_distill  # noqa: E402
from tests.distill.test_distill import TINY  # noqa: E402

SEQ = 32


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory and a target that has learnt to count (so its greedy tokens are predictable)."""
    return counting_workdir(tmp_path_factory.mktemp("medusa"), TINY, SEQ)


def test_head_losses_start_at_the_base_guess_and_cover_every_head(workdir: Path) -> None:
    target = transformers.AutoModelForCausalLM.from_pretrained(workdir / "target", dtype=torch.float32)
    features = collect(target, eval_windows(TokenData.load(workdir / "data").heldout, SEQ, 600), 4)
    heads, weight = MedusaHeads(3, TINY["hidden_size"]), target.get_output_embeddings().weight
    cfg = TrainConfig(kl_weight=1.0, ce_weight=1.0)
    total, kl, ce = head_losses(heads, weight, features.hidden.float(), features.greedy, cfg)
    assert torch.isclose(total, kl + ce) and kl > 0
    stats = head_accuracy(heads, weight, features)
    # Fresh heads draft the base guess for p + 1 at p + 2 + j: on a counting stream that is always wrong.
    assert len(stats["top1"]) == 3 and max(stats["top1"]) < 0.2 and stats["mean_accepted"] < 0.2


def test_medusa_cli_lowers_the_loss_and_writes_a_loadable_directory(workdir: Path) -> None:
    out = workdir / "heads"
    args = parse_distill([
        "distill", "--method", "medusa", "--teacher", str(workdir / "target"), "--data", str(workdir / "data"),
        "--out", str(out), "--num-heads", "3", "--steps", "60", "--batch-size", "8", "--seq-len", str(SEQ),
        "--train-tokens", "8000", "--lr", "1e-2", "--warmup-steps", "5", "--log-every", "10",
        "--kl-weight", "0", "--ce-weight", "1", "--eval-tokens", "1000", "--agreement-positions", "128",
        "--device", "cpu", "--no-progress",
    ])
    assert args.func(args) == 0
    summary = json.loads((out / "distill_summary.json").read_text())
    curve = summary["curve"]
    assert curve[-1][2] < 0.5 * curve[0][2]
    held = summary["eval"]["heldout"]
    assert len(held["top1"]) == 3 and held["top1"][0] > 0.5 and held["mean_accepted"] > 0.5
    assert "on_policy" in summary["eval"]
    config = json.loads((out / "config.json").read_text())
    assert config["medusa_num_heads"] == 3 and config["hidden_size"] == TINY["hidden_size"]
    target = load_model(str(workdir / "target"), load_model_arch(str(workdir / "target")), torch.float32, "cpu")
    proposer = MedusaProposer(str(out), target, "cpu", torch.float32)
    drafts = proposer.propose([DraftRequest("a", [1, 2], [1], 5)], torch.randn(1, TINY["hidden_size"])).tolist()
    assert len(drafts[0]) == 3


def test_student_config_is_still_required_for_a_draft_model(workdir: Path) -> None:
    args = parse_distill(["distill", "--teacher", str(workdir / "target"), "--data", str(workdir / "data"),
                          "--out", str(workdir / "x"), "--device", "cpu"])
    assert args.method == "draft_model"
    with pytest.raises(ValueError, match="--student-config"):
        args.func(args)


def test_medusa_options_are_validated(workdir: Path) -> None:
    args = parse_distill(["distill", "--method", "medusa", "--teacher", str(workdir / "target"), "--data",
                          str(workdir / "data"), "--out", str(workdir / "y"), "--num-heads", "0", "--device", "cpu"])
    with pytest.raises(ValueError, match="--num-heads must be >= 1"):
        args.func(args)
