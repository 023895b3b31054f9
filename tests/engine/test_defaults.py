"""Scheduler defaults by device and usage (lamina/engine/defaults.py): filled in, never overriding the user."""
from __future__ import annotations

import logging

import pytest
import torch

from lamina.config import SchedulerConfig
from lamina.engine.defaults import (CPU_DEFAULTS, CUDA_DEFAULTS, MIN_KV_TOKENS_PER_SEQ, defaults_for,
                                    fit_to_kv_capacity, resolve_scheduler_config)
from lamina.llm import LLM
from tests.helpers.tiny_models import make_tiny_model

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_unset_limits_come_from_the_device() -> None:
    assert resolve_scheduler_config(SchedulerConfig(), CPU, "offline") == SchedulerConfig(
        max_num_seqs=CPU_DEFAULTS.max_num_seqs, max_num_batched_tokens=CPU_DEFAULTS.max_num_batched_tokens)
    gpu = resolve_scheduler_config(SchedulerConfig(), CUDA, "serve")
    assert (gpu.max_num_seqs, gpu.max_num_batched_tokens) == (CUDA_DEFAULTS["serve"].max_num_seqs,
                                                              CUDA_DEFAULTS["serve"].max_num_batched_tokens)
    assert defaults_for(CUDA, "offline").max_num_batched_tokens > CPU_DEFAULTS.max_num_batched_tokens


def test_values_the_user_set_are_kept() -> None:
    asked = SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=None)
    resolved = resolve_scheduler_config(asked, CUDA, "offline")
    assert resolved.max_num_seqs == 3
    assert resolved.max_num_batched_tokens == CUDA_DEFAULTS["offline"].max_num_batched_tokens
    small_kv = fit_to_kv_capacity(resolved, asked, CUDA, kv_capacity_tokens=100)
    assert small_kv.max_num_seqs == 3  # set by the user: never lowered


def test_defaulted_max_num_seqs_fits_the_kv_cache_on_cuda() -> None:
    asked = SchedulerConfig()
    resolved = resolve_scheduler_config(asked, CUDA, "offline")
    assert fit_to_kv_capacity(resolved, asked, CUDA, 10 * MIN_KV_TOKENS_PER_SEQ).max_num_seqs == 10
    assert fit_to_kv_capacity(resolved, asked, CUDA, 10**9).max_num_seqs == resolved.max_num_seqs
    assert fit_to_kv_capacity(resolved, asked, CUDA, 5).max_num_seqs == 1
    cpu = resolve_scheduler_config(asked, CPU, "offline")
    assert fit_to_kv_capacity(cpu, asked, CPU, 5).max_num_seqs == cpu.max_num_seqs


def test_bad_usage_and_bad_values_name_the_field() -> None:
    with pytest.raises(ValueError, match="usage"):
        defaults_for(CPU, "batch")
    with pytest.raises(ValueError, match="max_num_seqs"):
        SchedulerConfig(max_num_seqs=0)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        SchedulerConfig(max_num_batched_tokens=True)


def test_engine_logs_and_exposes_the_chosen_values(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    path = make_tiny_model("llama", tmp_path, vocab_size=320)
    with caplog.at_level(logging.INFO, logger="lamina.engine.defaults"):
        llm = LLM(str(path), num_kv_blocks=64, block_size=4, skip_tokenizer_init=True)
    sched = llm.engine.config.scheduler_config
    assert (sched.max_num_seqs, sched.max_num_batched_tokens) == (CPU_DEFAULTS.max_num_seqs,
                                                                  CPU_DEFAULTS.max_num_batched_tokens)
    assert "max_num_seqs 128 (default for cpu, offline)" in caplog.text
    llm.engine.check_integrity()
