"""Worker: loads the model, sizes and allocates the paged KV cache, owns the ModelRunner.

Its life, driven by an executor (lamina/executor/):

    Worker(config, arch)            load the weights
    determine_num_blocks()          KV blocks that fit (profiled on CUDA; the executor takes the minimum)
    initialize_cache(num_blocks)    allocate and bind the KV cache; fixes max_model_len
    compile_and_capture(max_seqs)   compile kernels, capture decode CUDA graphs
    execute_model(step message)     one step -> PendingStep

Under tensor parallelism every rank has a Worker (lamina/executor/multiproc.py drives them in lock step):
it builds its shard of the model inside parallel_state.building(group), and its KV cache holds its own
KV heads only (`rank_arch`: the architecture as one rank sees it).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import time

import torch

from lamina.config import MAX_SPEC_TOKENS, DEFAULT_CPU_KV_BYTES, EngineConfig, KernelChoice, ModelArch
from lamina.device import resolve_device, resolve_dtype
from lamina.distributed.parallel_state import SINGLE, TensorParallelGroup, building
from lamina.kernels import compile_counter
from lamina.kv.cache import (allocate_kv_caches, attention_layers, bind_kv_caches, kv_cache_bytes_per_block,
                             resolve_kv_dtype)
from lamina.kv.fp8_scales import calibrate_kv_scales
from lamina.loader.hf_config import check_model_len
from lamina.loader.model_loader import load_model
from lamina.step import SchedulerOutput
from lamina.spec.proposer import draft_tree, make_model_proposer
from lamina.worker.cuda_graphs import CudaGraphRunner, graph_decision
from lamina.worker.drafter import Drafter
from lamina.worker.kv_sizing import blocks_for_utilization, profile_peak_bytes
from lamina.worker.model_runner import ModelRunner
from lamina.worker.pending_step import PendingStep
from lamina.worker.warmup import warm_up_kernels

logger = logging.getLogger(__name__)


def rank_arch(arch: ModelArch, tp_size: int) -> ModelArch:
    """The architecture as one of `tp_size` ranks holds it: its share of the attention and KV heads (one KV
    head each, replicated, when there are fewer KV heads than ranks). The KV cache is sized from it."""
    if tp_size == 1:
        return arch
    return dataclasses.replace(arch, num_attention_heads=arch.num_attention_heads // tp_size,
                               num_key_value_heads=max(1, arch.num_key_value_heads // tp_size))


class Worker:
    def __init__(self, config: EngineConfig, arch: ModelArch, group: TensorParallelGroup = SINGLE,
                 device: torch.device | None = None) -> None:
        """`group`: this rank's tensor-parallel group; `device`: its device (default: config.device)."""
        self.config = config
        self.arch = arch
        self.group = group
        self.rank_arch = rank_arch(arch, group.size)
        self.device = device if device is not None else resolve_device(config.device)
        self.dtype = resolve_dtype(config.model_config.dtype, arch, self.device)
        cache = config.cache_config
        self.kv_dtype = resolve_kv_dtype(cache.kv_cache_dtype, self.dtype)  # the target's; a draft keeps its own
        with building(group):
            self.model = load_model(config.model_config.model, arch, self.dtype, self.device,
                                    load_format=config.model_config.load_format,
                                    attention_backend=config.attention_backend,
                                    kernels=KernelChoice(pdl=config.enable_pdl))
        if self.kv_dtype != self.dtype:  # an fp8 cache: the scales the checkpoint lacks, measured now
            calibrate_kv_scales(self.model, self.rank_arch, self.dtype, self.device)
        elif any(layer.kv_scales_loaded for layer in attention_layers(self.model)):
            logger.info("the checkpoint carries fp8 KV cache scales: kv_cache_dtype='fp8' would use them; "
                        "the cache is in %s (kv_cache_dtype=%r)", self.dtype, cache.kv_cache_dtype)
        spec = config.speculative_config
        self.tree = tree = draft_tree(spec)
        if tree is not None and tree.size > MAX_SPEC_TOKENS and self._attention_backend() != "torch":
            raise ValueError(f"speculative_token_tree: the Triton kernels verify trees of at most {MAX_SPEC_TOKENS} "
                             f"nodes (8 query tokens a request), this one has {tree.size}; attention_backend 'torch' "
                             "takes up to 63")
        self.proposer = None if spec is None else make_model_proposer(
            spec, self.model, arch, self.dtype, self.device, cache.block_size, config.attention_backend)
        drafter = None if self.proposer is None else Drafter(self.proposer, cache.block_size)
        self.runner = ModelRunner(self.model, cache.block_size, arch.vocab_size, self.device,
                                  config.model_config.seed, drafter, tree)
        self.num_blocks = 0  # set by initialize_cache
        self.max_model_len = 0

    def determine_num_blocks(self) -> int:
        """KV blocks this worker can hold: asked for, or what its memory budget fits."""
        return self._num_kv_blocks()

    def initialize_cache(self, num_blocks: int) -> None:
        """Allocate `num_blocks` KV blocks, bind them to the attention layers and fix max_model_len."""
        cache = self.config.cache_config
        self.num_blocks = num_blocks
        self.max_model_len = self._max_model_len()
        check_model_len(self.arch, self.max_model_len)
        bind_kv_caches(self.model, allocate_kv_caches(self.rank_arch, num_blocks, cache.block_size, self.kv_dtype,
                                                      self.device))
        if self.proposer is not None:
            self.proposer.bind_cache(num_blocks, cache.block_size)
        logger.info("KV cache: %d blocks of %d tokens (%d tokens), max_model_len %d, %s on %s",
                    num_blocks, cache.block_size, self.kv_capacity_tokens, self.max_model_len,
                    self.kv_dtype, self.device)

    @property
    def kv_capacity_tokens(self) -> int:
        return (self.num_blocks - 1) * self.config.cache_config.block_size

    def compile_and_capture(self, max_num_seqs: int) -> None:
        """Compile every kernel variant now, not in the first requests, and capture the decode graphs of
        batches of up to `max_num_seqs` (the engine's value once it is fitted to the KV capacity); the same for
        the proposer's own network, if it has one."""
        warm_up = None
        if self._triton_kernels_supported(self._attention_backend()):
            compile_counter.install()  # every compile from now on shows in the step stats
            warm_up = functools.partial(warm_up_kernels, block_size=self.config.cache_config.block_size,
                                        max_num_batched_tokens=self.config.scheduler_config.max_num_batched_tokens,
                                        max_model_len=self.max_model_len, device=self.device)
            warm_up(self.model)
        self.runner.graphs = self._capture_graphs(max_num_seqs)
        if self.proposer is not None:
            start = time.perf_counter()
            max_batch = 0 if self.runner.graphs is None else self.runner.graphs.buckets[-1]
            self.proposer.compile_and_capture(max_batch, self.max_model_len,
                                              self.config.speculative_config.num_speculative_tokens, warm_up)
            logger.info("proposer compiled and captured in %.1f s", time.perf_counter() - start)

    def _num_kv_blocks(self) -> int:
        cache = self.config.cache_config
        if cache.num_kv_blocks is not None:
            return cache.num_kv_blocks
        if self.device.type == "cuda" and cache.kv_cache_memory_bytes is None:
            return self._num_kv_blocks_from_utilization()
        budget = cache.kv_cache_memory_bytes or DEFAULT_CPU_KV_BYTES
        per_block = self._kv_bytes_per_block()
        num_blocks = budget // per_block
        if num_blocks < 2:
            raise ValueError(f"kv_cache_memory_bytes: {budget} bytes hold {num_blocks} KV blocks of "
                             f"{per_block} bytes; at least 2 are needed (block 0 is reserved)")
        return int(num_blocks)

    def _num_kv_blocks_from_utilization(self) -> int:
        cache, sched = self.config.cache_config, self.config.scheduler_config
        peak = profile_peak_bytes(self.model, self.rank_arch, sched.max_num_batched_tokens, sched.max_num_seqs,
                                  cache.block_size, self.dtype, self.device)
        total = torch.cuda.get_device_properties(self.device).total_memory
        per_block = self._kv_bytes_per_block()
        num_blocks = blocks_for_utilization(total, cache.gpu_memory_utilization, peak, per_block)
        logger.info("GPU memory: %.2f GiB total x %.2f utilization, %.2f GiB peak of weights + a %d-token "
                    "warm-up step -> %d KV blocks", total / 2**30, cache.gpu_memory_utilization, peak / 2**30,
                    sched.max_num_batched_tokens, num_blocks)
        return num_blocks

    def _kv_bytes_per_block(self) -> int:
        """The target's KV bytes per block, and the proposer's own (a draft model's) under the same block id."""
        block_size = self.config.cache_config.block_size
        own = self.proposer.kv_bytes_per_block(block_size) if self.proposer is not None else 0
        return kv_cache_bytes_per_block(self.rank_arch, block_size, self.kv_dtype) + own

    def _capture_graphs(self, max_num_seqs: int) -> CudaGraphRunner | None:
        """Capture decode steps (and verify steps, when drafting, and small prompt chunks) on CUDA with the Triton
        kernels (unless enforce_eager); None: eager."""
        backend = self._attention_backend()
        capture, why = graph_decision(self.device, self.config.enforce_eager, backend,
                                      self._triton_kernels_supported(backend))
        logger.info("decode steps: %s", why)
        if not capture:
            return None
        max_batch = min(self.config.cuda_graph_max_batch_size, max_num_seqs)
        spec = self.config.speculative_config
        query_lens = (1,) if spec is None else spec.verify_query_lens  # decode, verify
        graphs = CudaGraphRunner(self.model, max_batch, self.max_model_len, self.config.cache_config.block_size,
                                 self.device, query_lens=query_lens, tree=self.tree is not None,
                                 prefill_tokens=self.config.cuda_graph_prefill_tokens,
                                 sample=self.runner.kernel_sampling)
        start = time.perf_counter()
        graphs.capture_all()
        logger.info("CUDA graphs: %d buckets (1..%d) x query lengths %s, prompt chunks in %s, captured in %.1f s",
                    len(graphs.buckets), max_batch, list(query_lens),
                    {q: s.buckets for q, s in graphs.sets.items() if q not in query_lens} or "none",
                    time.perf_counter() - start)
        return graphs

    def _attention_backend(self) -> str:
        return attention_layers(self.model)[0].backend.name

    def _triton_kernels_supported(self, backend_name: str) -> bool:
        if backend_name != "triton" or self.device.type != "cuda":
            return False
        from lamina.attention.triton_backend import supports  # imports triton: only for this backend
        return supports(self.arch.head_dim, self.dtype)

    def _max_model_len(self) -> int:
        asked = self.config.model_config.max_model_len
        limit = self.arch.max_position_embeddings
        if asked is None:
            # Full attention is exact only within a sliding window: stay inside it unless asked.
            window = self.arch.sliding_window or limit
            return min(limit, window, self.kv_capacity_tokens)
        if asked > limit:
            raise ValueError(f"max_model_len: {asked} is larger than the model's max_position_embeddings "
                             f"({limit})")
        if asked > self.kv_capacity_tokens:
            raise ValueError(f"max_model_len: {asked} tokens do not fit in the KV cache "
                             f"({self.kv_capacity_tokens} tokens); raise num_kv_blocks or "
                             f"kv_cache_memory_bytes, or lower max_model_len")
        return asked

    def execute_model(self, scheduled: SchedulerOutput) -> PendingStep:
        return self.runner.execute_model(scheduled)
