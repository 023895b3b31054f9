"""The executor an EngineConfig asks for: one worker in this process, or tensor parallelism over processes."""
from __future__ import annotations

from lamina.config import EngineConfig, ModelArch
from lamina.executor.base import Executor

# Speculative methods that run on the workers with a network of their own: not sharded yet.
_TP_SPEC_METHODS = ("ngram",)


def check_tensor_parallel(config: EngineConfig, arch: ModelArch) -> None:
    """ValueError when the model cannot be split `tensor_parallel_size` ways; NotImplementedError for what
    tensor parallelism does not support yet (quantized checkpoints, model-based speculative decoding)."""
    size = config.tensor_parallel_size
    for name in ("num_attention_heads", "intermediate_size"):
        value = getattr(arch, name)
        if value % size:
            raise ValueError(f"tensor_parallel_size: {size} does not divide the model's {name} ({value})")
    kv = arch.num_key_value_heads
    if kv % size and size % kv:
        raise ValueError(f"tensor_parallel_size: {size} and the model's num_key_value_heads ({kv}) must divide "
                         "one another (KV heads are split across ranks, or replicated when fewer)")
    if arch.raw.get("quantization_config") is not None:
        raise NotImplementedError(f"tensor_parallel_size: {size} with a quantized checkpoint is not supported yet; "
                                  "use tensor_parallel_size=1")
    spec = config.speculative_config
    if spec is not None and spec.method not in _TP_SPEC_METHODS:
        raise NotImplementedError(f"tensor_parallel_size: {size} with speculative_config method {spec.method!r} "
                                  f"is not supported yet (supported: {list(_TP_SPEC_METHODS)})")


def make_executor(config: EngineConfig, arch: ModelArch) -> Executor:
    if config.tensor_parallel_size == 1:
        from lamina.executor.uniproc import UniProcExecutor
        return UniProcExecutor(config, arch)
    check_tensor_parallel(config, arch)
    from lamina.executor.multiproc import MultiProcExecutor
    return MultiProcExecutor(config, arch)
