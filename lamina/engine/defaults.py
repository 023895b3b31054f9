"""Scheduler limits for an engine given none: chosen by where it runs, as vLLM does by device and usage.

    where                    max_num_seqs   max_num_batched_tokens   measured on
    CPU                      128            2048                     W6 (docs/BENCHMARKS.md)
    CUDA, offline (LLM)      512            16384                    W1 sweep, H200 (docs/BENCHMARKS.md)
    CUDA, serve              512            16384                    W4 sweep, H200 (docs/BENCHMARKS.md)

On the H200, W1 (256 requests) puts every setting from 256 / 8192 up within 1.5% of each other (256 /
16384 first in run 3, 512 / 16384 1.5% behind it, the same defaults rerun 0.2% behind); W4 (Poisson
arrivals, 8 / 32 / inf req/s) gives 512 / 16384 the lowest mean TTFT and TPOT and the highest throughput
at every rate: W4 decided. Offline and serve are separate rows so that either can move on its own evidence.

On CUDA max_num_seqs is also held to what the KV cache can run at once: at most one running request per
MIN_KV_TOKENS_PER_SEQ tokens of capacity (a small cache would otherwise thrash on preemption).
A value the user set is never changed.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

from lamina.config import SchedulerConfig

logger = logging.getLogger(__name__)

USAGES = ("offline", "serve")
MIN_KV_TOKENS_PER_SEQ = 1024


@dataclass(frozen=True)
class SchedulerDefaults:
    max_num_seqs: int
    max_num_batched_tokens: int


CPU_DEFAULTS = SchedulerDefaults(max_num_seqs=128, max_num_batched_tokens=2048)
CUDA_DEFAULTS = {"offline": SchedulerDefaults(max_num_seqs=512, max_num_batched_tokens=16384),
                 "serve": SchedulerDefaults(max_num_seqs=512, max_num_batched_tokens=16384)}


def defaults_for(device: torch.device, usage: str) -> SchedulerDefaults:
    if usage not in USAGES:
        raise ValueError(f"usage: must be one of {USAGES}, got {usage!r}")
    return CUDA_DEFAULTS[usage] if device.type == "cuda" else CPU_DEFAULTS


def resolve_scheduler_config(config: SchedulerConfig, device: torch.device, usage: str) -> SchedulerConfig:
    """`config` with every unset (None) limit filled in from `defaults_for(device, usage)`."""
    defaults = defaults_for(device, usage)
    filled = {name: getattr(defaults, name) for name in ("max_num_seqs", "max_num_batched_tokens")
              if getattr(config, name) is None}
    return dataclasses.replace(config, **filled)


def fit_to_kv_capacity(config: SchedulerConfig, asked: SchedulerConfig, device: torch.device,
                       kv_capacity_tokens: int) -> SchedulerConfig:
    """Lower a defaulted max_num_seqs on CUDA to the requests the KV cache can hold (module docstring)."""
    if asked.max_num_seqs is not None or device.type != "cuda":
        return config
    fits = max(1, kv_capacity_tokens // MIN_KV_TOKENS_PER_SEQ)
    return dataclasses.replace(config, max_num_seqs=min(config.max_num_seqs, fits))


def log_scheduler_config(config: SchedulerConfig, asked: SchedulerConfig, device: torch.device,
                         usage: str) -> None:
    def source(name: str) -> str:
        return "set" if getattr(asked, name) is not None else f"default for {device.type}, {usage}"
    logger.info("scheduler: max_num_seqs %d (%s), max_num_batched_tokens %d (%s)",
                config.max_num_seqs, source("max_num_seqs"), config.max_num_batched_tokens,
                source("max_num_batched_tokens"))
