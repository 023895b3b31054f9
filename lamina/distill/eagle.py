"""`lamina distill --method eagle`: an EAGLE-3 head (lamina/spec/eagle_head.py) trained on the target's outputs.

The frozen target (HF transformers) runs once over windows of the data and, optionally, over its own greedy
continuations of data prompts (--self-generated: what speculation meets); per position p it leaves the features
f[p] (its residual stream entering the head's `aux_hidden_state_layers`: HF's hidden_states[i]) and its greedy
token g[p] (its prediction for p + 1). The head trains with training-time test (lamina/distill/eagle_ttt.py):

    step 0 at base p:   feed (x[p + 1], fc(f[p]))       label g[p + 1]     (x: the window's tokens)
    step j >= 1:        feed (g[p + j], y_{j-1}[p])     label g[p + j + 1] (its own features, the tokens a
                                                                            chain of accepted drafts feeds)
    loss = sum_j 0.8^j CE(lm_head(out_j), label_j) / sum_j 0.8^j          (--ttt-steps steps)

With --online the data windows are not cached: every step draws fresh random windows of train.bin and runs the
target over them (unbounded data for a GPU; the self-generated continuations stay cached and fill their share of
each batch, self_generated / (self_generated + train_tokens), as in the cached mix).

Evaluation: the top-1 agreement of each step with g, and the mean accepted length of a --ttt-steps chain (up to
its first miss), on held-out windows and on the target's greedy continuations of held-out prompts.
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
from tqdm.auto import tqdm

from lamina.device import resolve_device
from lamina.loader.hf_config import load_model_arch
from lamina.spec.eagle_head import EagleHead, EagleHeadConfig, default_aux_layers, save_head

from .checkpoint import count_parameters, teacher_and_data
from .config import TrainConfig
from .data import TokenData, WindowSampler, eval_windows
from .eagle_ttt import unroll
from .medusa import ON_POLICY, greedy_continuations
from .trainer import Trainer, _optimizer, apply_step, lr_at

SUMMARY = "distill_summary.json"
DECAY = 0.8  # EAGLE-3's weight of unroll step j: DECAY ** j


@dataclass(frozen=True)
class EagleFeatures:
    """The target's view of W windows: features [W, L, 3H] (bf16, CPU), greedy [W, L], tokens [W, L + 1]."""

    features: torch.Tensor
    greedy: torch.Tensor
    tokens: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return self.greedy.numel()


@torch.no_grad()
def target_view(teacher: torch.nn.Module, windows: torch.Tensor, layers: list[int]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The target over ``windows`` [W, L + 1] (inputs: all but the last token): features [W, L, 3H] and greedy
    tokens [W, L], on the target's device."""
    device = next(teacher.parameters()).device
    out = teacher(input_ids=windows[:, :-1].to(device), output_hidden_states=True, use_cache=False)
    return torch.cat([out.hidden_states[i] for i in layers], dim=-1), out.logits.argmax(dim=-1)


def collect(teacher: torch.nn.Module, windows: torch.Tensor, layers: list[int], batch_size: int,
            progress: bool = False, desc: str = "target") -> EagleFeatures:
    """The target's view of ``windows`` [W, L + 1], cached in CPU memory (features in bf16)."""
    feats, greedy = [], []
    for chunk in tqdm(windows.split(batch_size), desc=desc, disable=not progress, unit="batch", dynamic_ncols=True):
        f, g = target_view(teacher, chunk, layers)
        feats.append(f.to("cpu", torch.bfloat16))
        greedy.append(g.cpu())
    return EagleFeatures(torch.cat(feats), torch.cat(greedy), windows)


def step_tokens(tokens: torch.Tensor, greedy: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """What each unroll step feeds at each base (module docstring): [B, L] each, 0 past the window."""
    length = greedy.shape[1]
    out = [tokens[:, 1:length + 1]]
    for j in range(1, steps):
        out.append(F.pad(greedy[:, j:], (0, j)))
    return out


def ttt_losses(head: EagleHead, embed: torch.nn.Module, lm_weight: torch.Tensor, batch: EagleFeatures,
               steps: int, sample: int = 0, generator: torch.Generator | None = None
               ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(weighted loss, each step's logits over its valid bases [B * (L - j - 1), V]). sample > 0: the loss of
    each step reads that many random bases only (the LM head over the vocabulary is most of a step's cost)."""
    outs = unroll(head, embed, batch.features, step_tokens(batch.tokens, batch.greedy, steps))
    length, hidden = batch.greedy.shape[1], batch.features.shape[-1] // len(head.cfg.aux_hidden_state_layers)
    total, weights, logits = 0.0, 0.0, []
    for j, out in enumerate(outs):
        rows, labels = out[:, :length - j - 1].reshape(-1, hidden), batch.greedy[:, j + 1:].reshape(-1)
        if 0 < sample < len(labels):
            keep = torch.randperm(len(labels), generator=generator)[:sample].to(labels.device)
            rows, labels = rows[keep], labels[keep]
        step_logits = F.linear(rows, lm_weight)
        ce = F.cross_entropy(step_logits.float(), labels)
        total, weights = total + DECAY ** j * ce, weights + DECAY ** j
        logits.append(step_logits)
    return total / weights, logits


@dataclass
class OnlineWindows:
    """Fresh train windows every step, seen through the target (--online): ``rows`` of each batch."""

    teacher: torch.nn.Module
    sampler: WindowSampler
    layers: list[int]
    rows: int

    def draw(self) -> EagleFeatures:
        windows = self.sampler.next_windows()
        features, greedy = target_view(self.teacher, windows, self.layers)
        return EagleFeatures(features, greedy, windows)


class EagleTrainer(Trainer):
    """The student Trainer's loop (schedule, time budget, curve) over the head; a step draws ``batch_size``
    random windows: of the cached features, or ``online.rows`` of them fresh through the target and the rest
    cached (the self-generated continuations)."""

    def __init__(self, head: EagleHead, embed: torch.nn.Module, lm_weight: torch.Tensor, data: EagleFeatures | None,
                 cfg: TrainConfig, steps: int, loss_positions: int = 0, online: OnlineWindows | None = None):
        self.cfg, self.compiled, self.ttt_steps, self.loss_positions = cfg, False, steps, loss_positions
        self.device = resolve_device(cfg.device)
        self.student = head.to(self.device).train()
        self.embed = embed.to(self.device)
        self.lm_weight = lm_weight.detach().to(self.device, torch.float32)
        self.data, self.online = data, online
        self.optimizer = _optimizer(self.student, cfg, self.device)
        self.generator = torch.Generator().manual_seed(cfg.seed)

    def _batch(self) -> EagleFeatures:
        cached = self.cfg.batch_size - (self.online.rows if self.online else 0)
        parts = [self.online.draw()] if self.online else []
        if cached > 0:
            rows = torch.randint(0, len(self.data.greedy), (cached,), generator=self.generator)
            parts.append(EagleFeatures(self.data.features[rows], self.data.greedy[rows], self.data.tokens[rows]))
        features, greedy, tokens = (torch.cat([getattr(p, f).to(self.device) for p in parts])
                                    for f in ("features", "greedy", "tokens"))
        return EagleFeatures(features.float(), greedy, tokens)

    def step(self, step: int, total: int) -> torch.Tensor:
        """One optimizer step; returns the detached ``[total, 0, ce]`` losses (no KL term)."""
        batch = self._batch()
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(step, total, self.cfg)
        with torch.autocast(self.device.type, dtype=torch.bfloat16):  # bf16 matmuls on CPU too (AVX512-BF16)
            loss, _ = ttt_losses(self.student, self.embed, self.lm_weight, batch, self.ttt_steps, self.loss_positions,
                                 self.generator)
        return apply_step((loss, torch.zeros_like(loss), loss), self.student, self.optimizer, self.cfg.grad_clip)


@torch.no_grad()
def head_accuracy(head: EagleHead, embed: torch.nn.Module, lm_weight: torch.Tensor, data: EagleFeatures,
                  steps: int, start: int = 0, batch_size: int = 8) -> dict:
    """Top-1 agreement of each unroll step with the target's greedy token at bases p >= ``start``, and the mean
    accepted length of a chain of ``steps`` drafts (up to its first miss, bases where every step has a label)."""
    hits, counts, accepted = [0] * steps, [0] * steps, []
    device = lm_weight.device
    for rows in torch.arange(len(data.greedy)).split(batch_size):
        batch = EagleFeatures(data.features[rows].to(device, torch.float32), data.greedy[rows].to(device),
                              data.tokens[rows].to(device))
        _, logits = ttt_losses(head, embed, lm_weight, batch, steps)
        length, match = batch.greedy.shape[1], []
        for j, step_logits in enumerate(logits):
            right = (step_logits.argmax(-1).view(len(rows), -1) == batch.greedy[:, j + 1:])[:, start:]
            hits[j], counts[j] = hits[j] + int(right.sum()), counts[j] + right.numel()
            match.append(right[:, :length - start - steps].long())
        accepted.append(torch.stack(match).cumprod(dim=0).sum(dim=0).flatten().cpu())
    chain = torch.cat(accepted).float()
    return {"positions": counts[0], "top1": [round(h / max(c, 1), 4) for h, c in zip(hits, counts)],
            "mean_accepted": round(float(chain.mean()), 4),
            "accepted_hist": [round(float((chain == n).float().mean()), 4) for n in range(steps + 1)]}


def continuations(teacher_dir: str, tokens: np.ndarray, prompts: int, length: int, seed: int = 0,
                  device: str = "cpu") -> torch.Tensor:
    """``prompts`` random prompts of ``length`` tokens of ``tokens``, each continued greedily by ``length``
    tokens by the target run in lamina's own engine: [prompts, 2 * length]."""
    from lamina import LLM, SamplingParams  # the engine: only for this option

    gen = np.random.default_rng(seed)
    starts = gen.integers(0, len(tokens) - length, prompts)
    ids = [[int(t) for t in tokens[s:s + length]] for s in starts]
    llm = LLM(teacher_dir, device=device, dtype="float32", max_model_len=2 * length + 1, skip_tokenizer_init=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in ids],
                        SamplingParams(temperature=0, max_tokens=length, ignore_eos=True), use_tqdm=False)
    llm.engine.executor.shutdown()
    return torch.tensor([p + list(o.outputs[0].token_ids) for p, o in zip(ids, outs)], dtype=torch.long)


def head_config(teacher_dir: str, intermediate_size: int | None) -> EagleHeadConfig:
    arch = load_model_arch(teacher_dir)
    return EagleHeadConfig(arch.hidden_size, arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim,
                           intermediate_size or arch.intermediate_size,
                           tuple(default_aux_layers(arch.num_hidden_layers)), arch.rms_norm_eps, arch.rope_theta,
                           arch.max_position_embeddings)


def _self_generated(teacher: torch.nn.Module, data: TokenData, layers: list[int], cfg: TrainConfig,
                    args: argparse.Namespace, show: bool) -> EagleFeatures:
    """The target's own greedy continuations of about --self-generated tokens of data prompts, seen by it."""
    length = cfg.seq_len // 2
    prompts = -(-args.self_generated // length)
    seqs = continuations(args.teacher, np.asarray(data.train), prompts, length + 1, args.seed + 1,
                         str(resolve_device(cfg.device)))[:, :cfg.seq_len + 1]
    return collect(teacher, seqs, layers, cfg.batch_size, show, "target over its own continuations")


def _train_set(teacher: torch.nn.Module, data: TokenData, layers: list[int], cfg: TrainConfig,
               args: argparse.Namespace, show: bool) -> tuple[EagleFeatures | None, OnlineWindows | None]:
    """The cached windows (data windows unless --online, plus --self-generated continuations) and, with
    --online, the fresh windows' share of each batch (module docstring)."""
    sets = [] if args.online else [collect(teacher, eval_windows(data.train, cfg.seq_len, args.train_tokens),
                                           layers, cfg.batch_size, show, "target over train.bin")]
    if args.self_generated > 0:
        sets.append(_self_generated(teacher, data, layers, cfg, args, show))
    cached = EagleFeatures(*(torch.cat([getattr(s, f) for s in sets]) for f in ("features", "greedy", "tokens"))
                           ) if sets else None
    if not args.online:
        return cached, None
    share = args.train_tokens / (args.train_tokens + args.self_generated)
    rows = cfg.batch_size if cached is None else min(cfg.batch_size - 1, max(1, round(cfg.batch_size * share)))
    sampler = WindowSampler(data.train, cfg.seq_len, rows, resolve_device(cfg.device), cfg.seed)
    return cached, OnlineWindows(teacher, sampler, layers, rows)


def run_eagle(args: argparse.Namespace, cfg: TrainConfig) -> int:
    """`lamina distill --method eagle`: collect, train, save, evaluate, write distill_summary.json."""
    device = resolve_device(cfg.device)
    data, teacher = teacher_and_data(args, device, "eagle", ("ttt_steps", "train_tokens"))
    embed, lm_weight = teacher.get_input_embeddings(), teacher.get_output_embeddings().weight
    hcfg = head_config(args.teacher, args.head_intermediate_size)
    if cfg.seq_len + args.ttt_steps > hcfg.max_position_embeddings:
        raise ValueError(f"--seq-len {cfg.seq_len} + --ttt-steps {args.ttt_steps} exceeds the teacher's "
                         f"max_position_embeddings {hcfg.max_position_embeddings}")
    layers, show, start = list(hcfg.aux_hidden_state_layers), not args.no_progress, time.perf_counter()
    cached, online = _train_set(teacher, data, layers, cfg, args, show)
    collect_s = time.perf_counter() - start
    positions = cached.num_tokens if cached is not None else 0
    torch.manual_seed(cfg.seed)
    head = EagleHead(hcfg).requires_grad_(True)
    if args.init_from:  # go on training a head directory (same target, same shapes)
        from lamina.spec.eagle import load_head
        head.load_state_dict(load_head(args.init_from)[0].float().state_dict())
    print(f"EAGLE head {count_parameters(head):,} params over layers {layers}; target "
          f"{count_parameters(teacher):,} params; {positions:,} positions cached in {collect_s:.0f}s"
          + (f"; {online.rows} of {cfg.batch_size} windows a step fresh through the target" if online else ""),
          flush=True)
    result = EagleTrainer(head, embed, lm_weight, cached, cfg, args.ttt_steps, args.loss_positions, online
                          ).run(progress=show)
    head.eval()
    save_head(head, args.out, lm_weight.shape[0], args.teacher, torch.bfloat16, target_num_hidden_layers=len(
        getattr(teacher.model, "layers", [])) or None)
    summary = {"date": time.strftime("%Y-%m-%d"), "method": "eagle",
               "options": {k: v for k, v in vars(args).items() if k != "func"},
               "head_params": count_parameters(head), "teacher_params": count_parameters(teacher),
               "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
               "train": {"positions_cached": positions, "collect_seconds": round(collect_s, 1),
                         "online_positions": (online.rows * cfg.seq_len * result.steps) if online else 0,
                         "steps": result.steps, "seconds": round(result.seconds, 1),
                         "final_loss": result.final_loss},
               "curve": [list(point) for point in result.curve],
               "eval": evaluate_head(head, teacher, data, layers, cfg.seq_len, args)}
    Path(args.out, SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({"train": summary["train"], "eval": summary["eval"]}, indent=2), flush=True)
    return 0


def evaluate_head(head: EagleHead, teacher: torch.nn.Module, data: TokenData, layers: list[int], seq_len: int,
                  args: argparse.Namespace) -> dict:
    """Held-out (teacher-forced) and on-policy (the target's greedy continuations) agreement with the target."""
    lm_weight = teacher.get_output_embeddings().weight.float()
    head, embed = head.to(lm_weight.device).float(), teacher.get_input_embeddings()
    out: dict = {}
    if args.eval_tokens > 0:
        held = collect(teacher, eval_windows(data.heldout, seq_len, args.eval_tokens), layers, args.batch_size)
        out["heldout"] = head_accuracy(head, embed, lm_weight, held, args.ttt_steps)
    if args.agreement_positions > 0:
        limit = getattr(teacher.config, "max_position_embeddings", None) or 2 * ON_POLICY
        length = min(ON_POLICY, limit // 2)
        prompts = max(1, -(-args.agreement_positions // length))
        seqs = greedy_continuations(teacher, np.asarray(data.heldout), prompts, length, args.seed)
        out["on_policy"] = head_accuracy(head, embed, lm_weight, collect(teacher, seqs, layers, args.batch_size),
                                         args.ttt_steps, length - 1)
    return out
