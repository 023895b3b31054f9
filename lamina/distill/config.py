"""Training options shared by `lamina distill` and the demo-model scripts."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainConfig:
    """How to train a student (or, with no teacher, a model from scratch).

    The loss is ``kl_weight * T^2 * KL(teacher_T || student_T) + ce_weight * CE(student, next token)``
    where ``_T`` means logits divided by ``temperature``. With ``kl_weight == 0`` the teacher is never run,
    which is how the plain cross-entropy baseline is trained on the same code path and data order.

    ``steps`` is the number of optimizer steps. With ``time_budget_s`` set, the step count is instead
    chosen after ``probe_steps`` steps from their measured speed so that training ends within the budget
    (the probe steps lie inside the warm-up, so the learning-rate schedule is not affected); ``steps``
    then acts as an upper bound.
    """

    steps: int = 1000
    time_budget_s: float | None = None
    batch_size: int = 64
    seq_len: int = 512
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    kl_weight: float = 1.0
    ce_weight: float = 0.0
    temperature: float = 1.0
    seed: int = 0
    device: str = "auto"
    compile: bool = False
    log_every: int = 50
    probe_steps: int = 12

    def __post_init__(self) -> None:
        _positive("steps", self.steps)
        _positive("batch_size", self.batch_size)
        _positive("seq_len", self.seq_len)
        _positive("lr", self.lr)
        _positive("temperature", self.temperature)
        _positive("log_every", self.log_every)
        if self.time_budget_s is not None:
            _positive("time_budget_s", self.time_budget_s)
            if self.probe_steps + 2 > max(self.warmup_steps, 3):
                raise ValueError(
                    f"warmup_steps must be >= probe_steps + 2 = {self.probe_steps + 2} when time_budget_s is "
                    f"set (the step count is chosen during warm-up), got {self.warmup_steps}"
                )
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.kl_weight < 0 or self.ce_weight < 0 or self.kl_weight + self.ce_weight == 0:
            raise ValueError(
                f"kl_weight and ce_weight must be >= 0 and not both 0, got {self.kl_weight}, {self.ce_weight}"
            )
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")

    @property
    def uses_teacher(self) -> bool:
        """Whether the teacher's logits are needed at all."""
        return self.kl_weight > 0


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")
