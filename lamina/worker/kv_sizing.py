"""Size the paged KV cache from GPU memory: what is left of `gpu_memory_utilization` of the GPU
after the weights and the activations of the largest step.

    budget = total_memory * gpu_memory_utilization - peak
    peak   = max_memory_allocated during a warm-up forward of max_num_batched_tokens tokens
             (weights + activations + logits of max_num_seqs rows)
    blocks = budget // bytes_per_block          (>= 2: block 0 is the null block)

The warm-up stores nothing (every slot is -1) and attends only to the null block of a 2-block
scratch cache, so it needs no real KV cache yet.
"""
from __future__ import annotations

import torch

from lamina.attention.metadata import set_attention_metadata
from lamina.kv.cache import MIN_NUM_BLOCKS, allocate_kv_caches, bind_kv_caches
from lamina.config import ModelArch
from lamina.worker.warmup import null_block_metadata, precompile


def split_tokens(num_tokens: int, max_len: int) -> list[int]:
    """`num_tokens` as sequences of at most `max_len` tokens (the longest ones first)."""
    full, rest = divmod(num_tokens, max_len)
    return [max_len] * full + ([rest] if rest else [])


@torch.inference_mode()
def warmup_forward(model: torch.nn.Module, arch: ModelArch, num_tokens: int, num_logit_rows: int,
                   block_size: int, dtype: torch.dtype, device: torch.device) -> None:
    """One forward of `num_tokens` tokens, then logits (and a softmax) for `num_logit_rows` rows."""
    bind_kv_caches(model, allocate_kv_caches(arch, MIN_NUM_BLOCKS, block_size, dtype, device))
    seq_lens = split_tokens(num_tokens, arch.max_position_embeddings)
    metadata = null_block_metadata([(n, n) for n in seq_lens], block_size, device)
    input_ids = torch.zeros(num_tokens, dtype=torch.int64, device=device)
    positions = torch.cat([torch.arange(n, device=device) for n in seq_lens])
    with set_attention_metadata(metadata):
        hidden = model(input_ids, positions)
    rows = torch.arange(min(num_logit_rows, num_tokens), device=device)
    torch.softmax(model.compute_logits(hidden[rows]), dim=-1)


def profile_peak_bytes(model: torch.nn.Module, arch: ModelArch, num_tokens: int, num_logit_rows: int,
                       block_size: int, dtype: torch.dtype, device: torch.device) -> int:
    """Peak bytes allocated by torch on `device` (weights included) during the warm-up forward (whose
    Triton kernels are compiled together first, on a thread pool: warmup.precompile)."""
    precompile(lambda: warmup_forward(model, arch, num_tokens, num_logit_rows, block_size, dtype, device))
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    warmup_forward(model, arch, num_tokens, num_logit_rows, block_size, dtype, device)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    torch.cuda.empty_cache()
    return int(peak)


def blocks_for_utilization(total_bytes: int, utilization: float, peak_bytes: int, bytes_per_block: int) -> int:
    """KV blocks that fit in `utilization` of the GPU next to `peak_bytes`; ValueError below 2."""
    budget = int(total_bytes * utilization) - peak_bytes
    num_blocks = max(0, budget) // bytes_per_block
    if num_blocks < MIN_NUM_BLOCKS:
        raise ValueError(
            f"gpu_memory_utilization: {utilization} of {total_bytes / 2**30:.1f} GiB leaves "
            f"{budget / 2**30:.2f} GiB after the weights and activations ({peak_bytes / 2**30:.2f} GiB), "
            f"room for {num_blocks} KV blocks of {bytes_per_block} bytes; at least {MIN_NUM_BLOCKS} are needed. "
            "Raise gpu_memory_utilization, lower max_num_batched_tokens, or use a smaller model")
    return int(num_blocks)
