"""The training loop: a student learns from a teacher's next-token distributions (or from data alone).

One step::

    x, y = random windows of train.bin                       [B, L] each
    t    = teacher(x).logits           (no grad; skipped when kl_weight == 0)
    s    = student(x).logits
    loss = kl_weight * T^2 * KL(t/T || s/T) + ce_weight * CE(s, y)
    AdamW step, gradient clipping, linear warm-up then cosine decay to min_lr_ratio * lr
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from lamina.device import resolve_device

from .config import TrainConfig
from .data import WindowSampler
from .losses import distill_loss


@dataclass
class TrainResult:
    """What a run did: steps, tokens, wall time and the loss curve ``(step, seconds, total, kl, ce)``."""

    steps: int
    tokens: int
    seconds: float
    curve: list[tuple[int, float, float, float, float]] = field(default_factory=list)
    compiled: bool = False

    @property
    def final_loss(self) -> float:
        return self.curve[-1][2] if self.curve else float("nan")


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine from ``lr`` to ``min_lr_ratio * lr`` at ``total``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


class _StudentLoss(torch.nn.Module):
    """Student forward + loss in one module, so `torch.compile` can fuse the logits' softmax work."""

    def __init__(self, student: torch.nn.Module, cfg: TrainConfig):
        super().__init__()
        self.student = student
        self.cfg = cfg

    def forward(self, x: torch.Tensor, y: torch.Tensor, teacher_logits: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = self.student(input_ids=x, use_cache=False).logits
        c = self.cfg
        return distill_loss(logits, teacher_logits, y, c.kl_weight, c.ce_weight, c.temperature)


def _teacher_logits(teacher: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return teacher(input_ids=x, use_cache=False).logits


def apply_step(losses: tuple[torch.Tensor, torch.Tensor, torch.Tensor], model: torch.nn.Module,
               optimizer: torch.optim.Optimizer, grad_clip: float) -> torch.Tensor:
    """Backward of losses[0] (the total), gradient clip, optimizer step; the detached [total, kl, ce]."""
    losses[0].backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return torch.stack([loss.detach() for loss in losses])


def _optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW; no weight decay on norms and biases (1-D parameters)."""
    params = list({id(p): p for p in model.parameters() if p.requires_grad}.values())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=device.type == "cuda")


class Trainer:
    """Runs :class:`TrainConfig` on a student (fp32 master weights; bf16 autocast on CUDA)."""

    def __init__(self, student: torch.nn.Module, teacher: torch.nn.Module | None, train_tokens,
                 cfg: TrainConfig):
        if cfg.uses_teacher and teacher is None:
            raise ValueError("kl_weight > 0 needs a teacher")
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        self.student = student.to(self.device).train()
        self.teacher = teacher if cfg.uses_teacher else None
        self.sampler = WindowSampler(train_tokens, cfg.seq_len, cfg.batch_size, self.device, cfg.seed)
        self.optimizer = _optimizer(self.student, cfg, self.device)
        self.loss_fn: torch.nn.Module = _StudentLoss(self.student, cfg)
        self.teacher_fn = _teacher_logits
        self.compiled = False
        if cfg.compile:
            self.loss_fn = torch.compile(self.loss_fn)
            self.teacher_fn = torch.compile(_teacher_logits)
            self.compiled = True

    def _autocast(self) -> torch.autocast:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda")

    def step(self, step: int, total: int) -> torch.Tensor:
        """One optimizer step; returns the detached ``[total, kl, ce]`` losses (no host sync)."""
        x, y = self.sampler.next_batch()
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(step, total, self.cfg)
        with self._autocast():
            t_logits = self.teacher_fn(self.teacher, x) if self.teacher is not None else None
            losses = self.loss_fn(x, y, t_logits)
        return apply_step(losses, self.student, self.optimizer, self.cfg.grad_clip)

    def _first_step(self, total: int) -> torch.Tensor:
        """Step 0, where compilation happens: if it fails, warn and go on without compiling."""
        if not self.compiled:
            return self.step(0, total)
        try:
            return self.step(0, total)
        except Exception as exc:  # noqa: BLE001 - any compiler failure; the eager path is always valid
            print(f"torch.compile failed ({type(exc).__name__}: {exc}); training without it", flush=True)
            self.optimizer.zero_grad(set_to_none=True)
            self.loss_fn, self.teacher_fn, self.compiled = _StudentLoss(self.student, self.cfg), _teacher_logits, False
            return self.step(0, total)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def run(self, progress: bool = True) -> TrainResult:
        """Train for ``cfg.steps`` (or as many as fit ``cfg.time_budget_s``) and return the curve."""
        cfg = self.cfg
        plan = _StepPlan(cfg, self._sync)
        curve: list[tuple[int, float, float, float, float]] = []
        bar = tqdm(total=plan.shown_total(), disable=not progress, unit="step", dynamic_ncols=True)
        step = 0
        while step < plan.total:
            losses = self._first_step(plan.total) if step == 0 else self.step(step, plan.total)
            step += 1
            bar.update(1)
            if plan.after_step(step):
                bar.total = plan.total
                bar.refresh()
            if step % cfg.log_every == 0 or step == plan.total:
                values = losses.tolist()
                curve.append((step, round(plan.elapsed(), 2), *values))
                bar.set_postfix(loss=f"{values[0]:.4f}", kl=f"{values[1]:.4f}", ce=f"{values[2]:.4f}")
                if not progress:
                    print(f"step {step}/{plan.total} {plan.elapsed():.0f}s loss {values[0]:.4f} "
                          f"kl {values[1]:.4f} ce {values[2]:.4f}", flush=True)
        self._sync()
        bar.close()
        return TrainResult(step, step * cfg.batch_size * cfg.seq_len, plan.elapsed(), curve, self.compiled)


class _StepPlan:
    """The planned step count. With a time budget it is set after the probe steps from the speed measured
    since step 2 (compilation excluded from the speed, included in the elapsed time) and re-planned every
    ``log_every`` steps, so a run that slows down still ends near its budget.
    """

    def __init__(self, cfg: TrainConfig, sync: Callable[[], None]):
        self.cfg = cfg
        self.total = cfg.steps
        self.sync = sync
        self.start = time.perf_counter()
        self.mark: float | None = None

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def shown_total(self) -> int | None:
        return None if self.cfg.time_budget_s is not None else self.total

    def after_step(self, step: int) -> bool:
        """Update the plan after ``step`` steps; True when ``total`` changed."""
        budget, probe_end = self.cfg.time_budget_s, self.cfg.probe_steps + 2
        if budget is None or step < 2:
            return False
        if step == 2:
            self.sync()
            self.mark = time.perf_counter()
            return False
        if step != probe_end and not (step > probe_end and step % self.cfg.log_every == 0):
            return False
        self.sync()
        per_step = (time.perf_counter() - self.mark) / (step - 2)
        remaining = budget - self.elapsed()
        old, self.total = self.total, max(step, min(self.cfg.steps, step + int(remaining / per_step)))
        return self.total != old
