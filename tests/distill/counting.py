"""What the head-training tests share: a data directory of counting streams and a tiny target trained on it (so
its greedy tokens are predictable), and `lamina distill`'s own argument parser."""
from __future__ import annotations

import argparse
from pathlib import Path

from lamina.distill.checkpoint import build_model, save_checkpoint
from lamina.distill.cli import register
from lamina.distill.config import TrainConfig
from lamina.distill.data import TokenData, write_token_data
from lamina.distill.trainer import Trainer
from tests.distill.test_distill import VOCAB, _stream


def counting_workdir(root: Path, target_config: dict, seq_len: int) -> Path:
    """root/data (20,000 train and 3,000 held-out tokens) and root/target, a model of `target_config` trained
    60 steps on them."""
    write_token_data(root / "data", _stream(20_000, 0), _stream(3_000, 1), VOCAB, 0)
    target = build_model(target_config, VOCAB, seed=0)
    cfg = TrainConfig(steps=60, batch_size=8, seq_len=seq_len, lr=1e-2, warmup_steps=5, kl_weight=0.0, ce_weight=1.0,
                      device="cpu", log_every=10)
    Trainer(target, None, TokenData.load(root / "data").train, cfg).run(progress=False)
    save_checkpoint(target.eval(), root / "target", None, eos_token_ids=[0])
    return root


def parse_distill(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lamina")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)
