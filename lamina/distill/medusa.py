"""`lamina distill --method medusa`: Medusa heads (lamina/spec/medusa.py) trained by self-distillation.

The target (HF transformers, frozen) runs once over windows of the data; its final hidden states (after the
last norm) and greedy tokens are cached, then only the heads train, on random windows of that cache::

    x      = a data window, L tokens (positions 0 .. L - 1)
    h[p]   = the target's final hidden state at p             (its LM head gives the logits for token p + 1)
    g[p]   = argmax lm_head(h[p]): the target's greedy token for p + 1, given the true prefix x[0 .. p]

    head j (0-based) reads h[p] and drafts token p + 2 + j; its teacher is the target at q = p + 1 + j:
    loss_j = kl_weight * T^2 * KL(softmax(lm_head(h[q]) / T) || softmax(lm_head(f_j(h[p])) / T))
           + ce_weight * CE(lm_head(f_j(h[p])), g[q])              over p in [0, L - 1 - j); loss = mean_j

Labels are the target's own predictions, not the data's tokens: speculation accepts a draft when it equals
what the target produces, and on held-out text heads trained on g beat heads trained on x (README of
lamina/assets/demo-medusa). Evaluation: per-head top-1 agreement with g on held-out windows, and the same
on greedy continuations of held-out prompts (on-policy: every token after the prompt is the target's own),
where a draft chain is accepted up to its first miss.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tqdm.auto import tqdm

from lamina.device import resolve_device
from lamina.spec.medusa import CONFIG, WEIGHTS, MedusaHeads

from .checkpoint import count_parameters, teacher_and_data
from .config import TrainConfig
from .data import TokenData, eval_windows
from .losses import kl_to_teacher, next_token_ce
from .trainer import Trainer, _optimizer, apply_step, lr_at

SUMMARY = "distill_summary.json"
ON_POLICY = 128  # prompt tokens and new tokens of an on-policy sequence (each at most half the context)


@dataclass(frozen=True)
class Features:
    """The target's view of some windows: hidden [W, L, H] (bf16, CPU), greedy [W, L] and data [W, L + 1]."""

    hidden: torch.Tensor
    greedy: torch.Tensor
    tokens: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return self.greedy.numel()


def _autocast(device: torch.device) -> torch.autocast:
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


@torch.no_grad()
def collect(teacher: torch.nn.Module, windows: torch.Tensor, batch_size: int, progress: bool = False,
            desc: str = "target") -> Features:
    """Run the frozen target over ``windows`` [W, L + 1] (inputs: all but the last token) and cache its view."""
    device = next(teacher.parameters()).device
    hidden, greedy = [], []
    for chunk in tqdm(windows.split(batch_size), desc=desc, disable=not progress, unit="batch", dynamic_ncols=True):
        with _autocast(device):
            out = teacher(input_ids=chunk[:, :-1].to(device), output_hidden_states=True, use_cache=False)
        hidden.append(out.hidden_states[-1].to("cpu", torch.bfloat16))
        greedy.append(out.logits.argmax(dim=-1).cpu())
    return Features(torch.cat(hidden), torch.cat(greedy), windows)


@torch.no_grad()
def greedy_continuations(teacher: torch.nn.Module, tokens: np.ndarray, prompts: int, length: int, seed: int = 0
                         ) -> torch.Tensor:
    """``prompts`` random prompts of ``length`` tokens from ``tokens``, each continued greedily by the target
    by ``length`` tokens (KV-cached): [prompts, 2 * length]."""
    device = next(teacher.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(tokens) - length, (prompts,), generator=gen)
    seq = torch.from_numpy(np.asarray(tokens, dtype=np.int64))[starts[:, None] + torch.arange(length)].to(device)
    past = None
    step_input = seq
    for _ in range(length):
        with _autocast(device):
            out = teacher(input_ids=step_input, past_key_values=past, use_cache=True)
        past, step_input = out.past_key_values, out.logits[:, -1:].argmax(dim=-1)
        seq = torch.cat([seq, step_input], dim=1)
    return seq.cpu()


def head_losses(heads: MedusaHeads, lm_weight: torch.Tensor, hidden: torch.Tensor, greedy: torch.Tensor,
                cfg: TrainConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(total, kl, ce) of a batch, each the mean over heads (module docstring); hidden [B, L, H]."""
    feats = heads(hidden)  # [K, B, L, H]
    target_logits = F.linear(hidden, lm_weight) if cfg.kl_weight > 0 else None
    kls, ces = [], []
    for j in range(heads.num_heads):
        shift = j + 1  # 2-D contiguous operands: a strided 3-D F.linear takes a slow bmm path on CPU
        logits = F.linear(feats[j, :, :-shift].reshape(-1, hidden.shape[-1]), lm_weight)
        ces.append(next_token_ce(logits, greedy[:, shift:]))
        if target_logits is not None:
            kls.append(kl_to_teacher(logits, target_logits[:, shift:].reshape(logits.shape), cfg.temperature))
    ce = torch.stack(ces).mean()
    kl = torch.stack(kls).mean() if kls else torch.zeros((), device=hidden.device)
    return cfg.kl_weight * kl + cfg.ce_weight * ce, kl, ce


class MedusaTrainer(Trainer):
    """The student Trainer's loop (schedule, time budget, curve) over the heads; a step draws ``batch_size``
    random windows of the cached features, i.e. ``batch_size * seq_len`` positions."""

    def __init__(self, heads: MedusaHeads, lm_weight: torch.Tensor, features: Features, cfg: TrainConfig):
        self.cfg, self.compiled = cfg, False
        self.device = resolve_device(cfg.device)
        self.student = heads.to(self.device).train()
        self.lm_weight = lm_weight.detach().to(self.device, torch.float32)
        self.features = features
        self.optimizer = _optimizer(self.student, cfg, self.device)
        self.generator = torch.Generator().manual_seed(cfg.seed)

    def _autocast(self) -> torch.autocast:
        # bf16 matmuls on CPU too: the LM head products dominate a step and run 2-3x faster (AVX512-BF16)
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def step(self, step: int, total: int) -> torch.Tensor:
        """One optimizer step; returns the detached ``[total, kl, ce]`` losses."""
        rows = torch.randint(0, len(self.features.greedy), (self.cfg.batch_size,), generator=self.generator)
        hidden = self.features.hidden[rows].to(self.device, torch.float32)
        greedy = self.features.greedy[rows].to(self.device)
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(step, total, self.cfg)
        with self._autocast():
            losses = head_losses(self.student, self.lm_weight, hidden, greedy, self.cfg)
        return apply_step(losses, self.student, self.optimizer, self.cfg.grad_clip)


@torch.no_grad()
def head_accuracy(heads: MedusaHeads, lm_weight: torch.Tensor, features: Features, start: int = 0,
                  batch_size: int = 8) -> dict:
    """Top-1 agreement of each head with the target's greedy token (and with the data's token) at positions
    p >= ``start``, and the mean number of drafts accepted in a chain (up to the first miss, over positions
    where every head has a label); teacher-forced."""
    k, device = heads.num_heads, lm_weight.device
    hits, data_hits, counts, accepted = [0] * k, [0] * k, [0] * k, []
    for rows in torch.arange(len(features.greedy)).split(batch_size):
        hidden = features.hidden[rows].to(device, torch.float32)
        greedy, data = features.greedy[rows].to(device), features.tokens[rows].to(device)
        length = greedy.shape[1]
        feats = heads(hidden).reshape(-1, hidden.shape[-1])
        drafts = F.linear(feats, lm_weight).argmax(dim=-1).view(k, len(rows), length)
        match = torch.zeros(k, len(rows), length - start - k, dtype=torch.long, device=device)
        for j in range(k):
            shift, span = j + 1, slice(start, length - j - 1)
            hits[j] += int((drafts[j, :, span] == greedy[:, start + shift:]).sum())
            data_hits[j] += int((drafts[j, :, span] == data[:, start + shift + 1:]).sum())
            counts[j] += greedy[:, start + shift:].numel()
            match[j] = (drafts[j, :, start:length - k] == greedy[:, start + shift:length - k + shift]).long()
        accepted.append(match.cumprod(dim=0).sum(dim=0).flatten().cpu())
    chain = torch.cat(accepted).float()
    return {"positions": counts[0], "top1": [round(h / c, 4) for h, c in zip(hits, counts)],
            "top1_vs_data": [round(h / c, 4) for h, c in zip(data_hits, counts)],
            "mean_accepted": round(float(chain.mean()), 4),
            "accepted_hist": [round(float((chain == n).float().mean()), 4) for n in range(k + 1)]}


def save_heads(heads: MedusaHeads, out_dir: str | Path, base_model: str, vocab_size: int) -> None:
    """Write a head directory: config.json and model.safetensors (bf16)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu", torch.bfloat16).contiguous() for name, t in heads.state_dict().items()}
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})
    config = heads.config_dict(base_model, vocab_size, architectures=["MedusaHeads"], torch_dtype="bfloat16")
    (out / CONFIG).write_text(json.dumps(config, indent=2) + "\n")


def run_medusa(args: argparse.Namespace, cfg: TrainConfig) -> int:
    """`lamina distill --method medusa`: collect, train, save, evaluate, write distill_summary.json."""
    device = resolve_device(cfg.device)
    data, teacher = teacher_and_data(args, device, "medusa", ("num_heads", "train_tokens"))
    lm_weight = teacher.get_output_embeddings().weight
    vocab, hidden_size = lm_weight.shape
    limit = getattr(teacher.config, "max_position_embeddings", None) or cfg.seq_len
    if cfg.seq_len > limit:
        raise ValueError(f"seq_len {cfg.seq_len} exceeds the teacher's max_position_embeddings {limit}")
    show = not args.no_progress
    start = time.perf_counter()
    train = collect(teacher, eval_windows(data.train, cfg.seq_len, args.train_tokens), cfg.batch_size, show,
                    "target over train.bin")
    collect_s = time.perf_counter() - start
    torch.manual_seed(cfg.seed)
    heads = MedusaHeads(args.num_heads, hidden_size)
    print(f"{args.num_heads} heads, {count_parameters(heads):,} params; target {count_parameters(teacher):,} "
          f"params; {train.num_tokens:,} train positions cached in {collect_s:.0f}s; device {device}", flush=True)
    result = MedusaTrainer(heads, lm_weight, train, cfg).run(progress=show)
    heads.eval()
    save_heads(heads, args.out, args.teacher, vocab)
    summary = {"date": time.strftime("%Y-%m-%d"), "method": "medusa",
               "options": {k: v for k, v in vars(args).items() if k != "func"},
               "heads_params": count_parameters(heads), "teacher_params": count_parameters(teacher),
               "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
               "train": {"positions_cached": train.num_tokens, "collect_seconds": round(collect_s, 1),
                         "steps": result.steps, "positions": result.tokens, "seconds": round(result.seconds, 1),
                         "final_loss": result.final_loss},
               "curve": [list(point) for point in result.curve],
               "eval": evaluate_heads(heads, teacher, data, cfg.seq_len, args)}
    Path(args.out, SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({"train": summary["train"], "eval": summary["eval"]}, indent=2), flush=True)
    return 0


def evaluate_heads(heads: MedusaHeads, teacher: torch.nn.Module, data: TokenData, seq_len: int,
                   args: argparse.Namespace) -> dict:
    """Held-out (teacher-forced) and on-policy (greedy continuations) agreement of the heads with the target."""
    lm_weight = teacher.get_output_embeddings().weight.float()
    heads = heads.to(lm_weight.device)
    out: dict = {}
    if args.eval_tokens > 0:
        held = collect(teacher, eval_windows(data.heldout, seq_len, args.eval_tokens), args.batch_size)
        out["heldout"] = head_accuracy(heads, lm_weight, held)
    if args.agreement_positions > 0:
        limit = getattr(teacher.config, "max_position_embeddings", None) or 2 * ON_POLICY
        length = min(ON_POLICY, limit // 2)
        prompts = max(1, -(-args.agreement_positions // length))
        seqs = greedy_continuations(teacher, data.heldout, prompts, length, args.seed)
        out["on_policy"] = head_accuracy(heads, lm_weight, collect(teacher, seqs, args.batch_size), length - 1)
    return out
