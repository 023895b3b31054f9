"""`lamina distill`: train a small draft / student model from a teacher's next-token distributions, or (with
`--method medusa`) Medusa heads on the teacher itself (lamina/distill/medusa.py)."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from lamina.device import resolve_device

from .checkpoint import build_model, count_parameters, load_teacher, save_checkpoint, student_config_dict
from .config import TrainConfig
from .data import TokenData
from .evaluate import greedy_agreement, perplexity
from .trainer import Trainer, TrainResult

SUMMARY = "distill_summary.json"

DESCRIPTION = """\
Train a student causal LM (default architecture: llama) on a teacher's next-token distributions:
loss = kl_weight * T^2 * KL(teacher/T || student/T) + ce_weight * CE(student, next token).
With --kl-weight 0 --ce-weight 1 the same command trains the student on the data alone (the baseline).

--data is a directory with meta.json {"vocab_size", "eos_token_id", "dtype": "uint16"}, train.bin and
heldout.bin: flat uint16 token ids, every document followed by eos (scripts/demo_model/tokenize_corpus.py
writes one). Training samples random windows of --seq-len + 1 tokens from train.bin; the held-out
perplexity and the greedy agreement with the teacher (k look-ahead) are measured on heldout.bin.

--out receives a Hugging Face checkpoint (config.json, model.safetensors in bf16, generation_config.json,
the teacher's tokenizer files) and distill_summary.json (options, loss curve, evaluation).

--method medusa trains K Medusa heads (--num-heads) on the frozen teacher instead of a student (no
--student-config): the teacher runs once over --train-tokens of train.bin, its final hidden states are
cached, and each head learns the teacher's own prediction 2 + j tokens ahead, with the same loss weights
(KL to the teacher's distribution there, CE to its greedy token; the shipped demo heads used --kl-weight 0
--ce-weight 1, as good and 5x cheaper on CPU). A step draws --batch-size windows of
--seq-len cached positions. --out receives a head directory (config.json, model.safetensors in bf16) for
speculative_config {"method": "medusa", "model": OUT}, and distill_summary.json with each head's held-out
top-1 agreement with the teacher (--eval-tokens) and on greedy continuations (--agreement-positions).

--method eagle trains an EAGLE-3 head (lamina/distill/eagle.py): the teacher's features from 3 of its layers
are cached over --train-tokens of train.bin (and --self-generated tokens of its own greedy continuations),
and one decoder layer learns the teacher's greedy tokens with a --ttt-steps training-time-test unroll (CE
only); with --online the train.bin windows are drawn fresh every step instead (no memory bound, for a GPU).
--out receives a head directory for speculative_config {"method": "eagle", "model": OUT}.
"""

METHODS = ("draft_model", "medusa", "eagle")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `lamina distill` (also used by `python -m lamina.distill`)."""
    a = parser.add_argument
    a("--method", choices=METHODS, default="draft_model",
      help="draft_model: train a student model (default); medusa: train Medusa heads on the teacher; eagle: "
           "train an EAGLE-3 head on the teacher's features")
    a("--teacher", required=True, help="teacher model directory (HF checkpoint, loadable by transformers)")
    a("--student-config",
      help="JSON file of student config fields (LlamaConfig names; model_type defaults to llama, "
           "vocab_size to the teacher's) or a model directory whose config.json to copy (draft_model: required)")
    a("--data", required=True, help="token data directory: meta.json, train.bin, heldout.bin (see above)")
    a("--out", required=True, help="output directory for the student checkpoint")
    a("--steps", type=int, default=None, help="optimizer steps (default 2000; with --time-budget an upper bound)")
    a("--time-budget", type=float, default=None, metavar="SEC",
      help="choose the step count from the measured speed so that training takes about SEC seconds")
    a("--batch-size", type=int, default=64, help="sequences per step (default 64)")
    a("--seq-len", type=int, default=512, help="tokens per sequence (default 512)")
    a("--lr", type=float, default=2e-3, help="peak learning rate of AdamW (default 2e-3)")
    a("--min-lr-ratio", type=float, default=0.1, help="final lr as a fraction of --lr, cosine decay (default 0.1)")
    a("--warmup-steps", type=int, default=100, help="linear warm-up steps (default 100)")
    a("--weight-decay", type=float, default=0.1, help="AdamW weight decay on matrices (default 0.1)")
    a("--grad-clip", type=float, default=1.0, help="gradient norm clip, 0 = off (default 1.0)")
    a("--kl-weight", type=float, default=1.0, help="weight of the KL term (default 1.0)")
    a("--ce-weight", type=float, default=0.0, help="weight of the next-token cross-entropy term (default 0.0)")
    a("--temperature", type=float, default=1.0, help="softmax temperature of the KL term (default 1.0)")
    a("--seed", type=int, default=0, help="seed of the initialisation and the data order (default 0)")
    a("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    a("--compile", action="store_true", help="torch.compile the student loss and the teacher forward")
    a("--eval-tokens", type=int, default=1_000_000,
      help="held-out tokens for the final perplexities, 0 = skip (default 1e6)")
    a("--agreement-positions", type=int, default=1024,
      help="held-out positions for the greedy agreement rate, 0 = skip (default 1024)")
    a("--k", type=int, default=4, help="look-ahead of the greedy agreement rate (default 4)")
    a("--log-every", type=int, default=50, help="steps between loss readings (default 50)")
    a("--no-progress", action="store_true", help="no progress bar")
    a("--num-heads", type=int, default=4, help="medusa: number of heads, K (default 4)")
    a("--train-tokens", type=int, default=2_000_000,
      help="medusa / eagle: train.bin tokens to run the teacher over and cache in CPU memory, hidden_size x 2 "
           "bytes each (eagle: x 3) (default 2e6)")
    a("--online", action="store_true",
      help="eagle: draw fresh train.bin windows every step and run the teacher over them instead of caching "
           "--train-tokens once (--train-tokens then sets only their share against --self-generated)")
    a("--ttt-steps", type=int, default=3, help="eagle: steps of the training-time-test unroll (default 3)")
    a("--self-generated", type=int, default=0,
      help="eagle: also train on about this many tokens of the teacher's own greedy continuations (default 0)")
    a("--loss-positions", type=int, default=0,
      help="eagle: random positions per unroll step that the loss reads, 0 = all (the LM head dominates a step)")
    a("--init-from", default=None, help="eagle: start from the weights of this head directory")
    a("--head-intermediate-size", type=int, default=None,
      help="eagle: the head's MLP width (default: the teacher's intermediate_size)")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `distill` subcommand to the `lamina` command."""
    parser = subparsers.add_parser(
        "distill", help="train a draft/student model from a teacher (KL + cross-entropy)",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Map the command-line options onto a validated :class:`TrainConfig`."""
    steps = args.steps if args.steps is not None else (10**9 if args.time_budget else 2000)
    return TrainConfig(
        steps=steps, time_budget_s=args.time_budget, batch_size=args.batch_size, seq_len=args.seq_len,
        lr=args.lr, min_lr_ratio=args.min_lr_ratio, warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay, grad_clip=args.grad_clip, kl_weight=args.kl_weight,
        ce_weight=args.ce_weight, temperature=args.temperature, seed=args.seed, device=args.device,
        compile=args.compile, log_every=args.log_every,
    )


def _check_positions(model: torch.nn.Module, seq_len: int, who: str) -> None:
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and seq_len > limit:
        raise ValueError(f"seq_len {seq_len} exceeds the {who}'s max_position_embeddings {limit}")


def run(args: argparse.Namespace) -> int:
    """Handler of `lamina distill`: train, save, evaluate, write distill_summary.json."""
    cfg = config_from_args(args)
    if args.method == "medusa":
        from .medusa import run_medusa

        return run_medusa(args, cfg)
    if args.method == "eagle":
        from .eagle import run_eagle

        return run_eagle(args, cfg)
    if args.student_config is None:
        raise ValueError("--student-config is required by --method draft_model")
    device = resolve_device(cfg.device)
    data = TokenData.load(args.data)
    teacher_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    teacher = load_teacher(args.teacher, device, teacher_dtype)
    vocab = teacher.config.vocab_size
    if data.vocab_size > vocab:
        raise ValueError(f"data: vocab_size {data.vocab_size} exceeds the teacher's {vocab}")
    student = build_model(student_config_dict(args.student_config), vocab, cfg.seed)
    for model, who in ((teacher, "teacher"), (student, "student")):
        _check_positions(model, cfg.seq_len, who)
    print(f"teacher {count_parameters(teacher):,} params, student {count_parameters(student):,} params, "
          f"{len(data.train):,} train tokens, device {device}", flush=True)
    result = Trainer(student, teacher, data.train, cfg).run(progress=not args.no_progress)
    save_checkpoint(student, args.out, args.teacher)
    summary = _summary(args, cfg, teacher, student, result)
    summary["eval"] = evaluate_pair(student.eval(), teacher, data, cfg.seq_len, args)
    Path(args.out, SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({"train": summary["train"], "eval": summary["eval"]}, indent=2), flush=True)
    return 0


def evaluate_pair(student: torch.nn.Module, teacher: torch.nn.Module, data: TokenData, seq_len: int,
                  args: argparse.Namespace) -> dict:
    """Held-out perplexity of both models and the student's greedy agreement with the teacher."""
    out: dict = {}
    if args.eval_tokens > 0:
        out["student"] = perplexity(student, data.heldout, seq_len, max_tokens=args.eval_tokens)
        out["teacher"] = perplexity(teacher, data.heldout, seq_len, max_tokens=args.eval_tokens)
    if args.agreement_positions > 0:
        out["agreement"] = greedy_agreement(student, teacher, data.heldout, k=args.k,
                                            positions=args.agreement_positions).to_dict()
    return out


def _summary(args: argparse.Namespace, cfg: TrainConfig, teacher: torch.nn.Module, student: torch.nn.Module,
             result: TrainResult) -> dict:
    return {
        "date": time.strftime("%Y-%m-%d"),
        "options": {k: v for k, v in vars(args).items() if k != "func"},
        "teacher_params": count_parameters(teacher),
        "student_params": count_parameters(student),
        "device": torch.cuda.get_device_name() if resolve_device(cfg.device).type == "cuda" else "cpu",
        "train": {"steps": result.steps, "tokens": result.tokens, "seconds": round(result.seconds, 1),
                  "compiled": result.compiled, "final_loss": result.final_loss},
        "curve": [list(point) for point in result.curve],
    }
