"""Train the demo teacher from scratch with next-token cross-entropy (lamina.distill's trainer, no teacher).

Writes an HF checkpoint (config.json, model.safetensors in bf16, generation_config.json with both stop
ids, the tokenizer files) and training_summary.json (options, loss curve, held-out perplexity).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from lamina.device import resolve_device
from lamina.distill.checkpoint import build_model, count_parameters, save_checkpoint, student_config_dict
from lamina.distill.config import TrainConfig
from lamina.distill.data import TokenData
from lamina.distill.evaluate import perplexity
from lamina.distill.trainer import Trainer
from tokenizers import Tokenizer


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", required=True, help="JSON file of LlamaConfig fields (teacher_config.json)")
    p.add_argument("--data", required=True, help="token data directory (tokenize_corpus.py)")
    p.add_argument("--tokenizer", required=True, help="directory with tokenizer.json + tokenizer_config.json")
    p.add_argument("--out", required=True, help="checkpoint directory to write")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (upper bound with --time-budget)")
    p.add_argument("--time-budget", type=float, default=None, help="seconds of training; sets the step count")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup-steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--eval-tokens", type=int, default=None, help="held-out tokens to score (default: all)")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    cfg = TrainConfig(
        steps=args.steps or (10**9 if args.time_budget else 1000), time_budget_s=args.time_budget,
        batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr, warmup_steps=args.warmup_steps,
        kl_weight=0.0, ce_weight=1.0, seed=args.seed, device=args.device, compile=args.compile, log_every=100,
    )
    data = TokenData.load(args.data)
    model = build_model(student_config_dict(args.config), data.vocab_size, args.seed)
    print(f"teacher: {count_parameters(model):,} params, {len(data.train):,} train tokens", flush=True)
    result = Trainer(model, None, data.train, cfg).run(progress=not args.no_progress)
    tok = Tokenizer.from_file(str(Path(args.tokenizer) / "tokenizer.json"))
    stop_ids = [tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|end|>")]
    save_checkpoint(model, args.out, None, eos_token_ids=stop_ids)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (Path(args.out) / name).write_bytes((Path(args.tokenizer) / name).read_bytes())
    start = time.perf_counter()
    ppl = perplexity(model.eval(), data.heldout, cfg.seq_len, max_tokens=args.eval_tokens)
    summary = {
        "date": time.strftime("%Y-%m-%d"), "options": vars(args), "params": count_parameters(model),
        "device": torch.cuda.get_device_name() if resolve_device(cfg.device).type == "cuda" else "cpu",
        "train": {"steps": result.steps, "tokens": result.tokens, "seconds": round(result.seconds, 1),
                  "compiled": result.compiled, "final_loss": result.final_loss},
        "heldout": ppl, "eval_seconds": round(time.perf_counter() - start, 1),
        "curve": [list(p) for p in result.curve],
    }
    Path(args.out, "training_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: summary[k] for k in ("params", "train", "heldout")}, indent=2), flush=True)


if __name__ == "__main__":
    main()
