"""Engine configuration: small frozen dataclasses, validated on construction.

Fields use vLLM's names so a reader who knows one engine can map them 1:1. The CLI builds its
flags from these fields; nothing in core code reads environment variables.
"""
from __future__ import annotations

from dataclasses import dataclass, field

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
ATTENTION_BACKENDS = ("auto", "torch", "triton")
LOAD_FORMATS = ("auto", "dummy")


def _require(ok: bool, field_name: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{field_name}: {message}")


def _positive_or_none(value: int | None, name: str) -> None:
    _require(value is None or (isinstance(value, int) and value > 0), name,
             f"must be a positive integer or None, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    """What to load: a local HF model directory (or, with load_format="dummy", a config.json) and how to run it."""

    model: str
    dtype: str = "auto"  # "auto": the checkpoint's dtype on GPU, float32 on CPU
    max_model_len: int | None = None  # None: min(max_position_embeddings, KV capacity)
    seed: int = 0
    skip_tokenizer_init: bool = False
    tokenizer: str | None = None  # None: the model directory
    max_logprobs: int = 20  # the most top-N logprobs a request may ask for
    load_format: str = "auto"  # "auto": the safetensors checkpoint; "dummy": random weights, no checkpoint

    def __post_init__(self) -> None:
        _require(isinstance(self.model, str) and bool(self.model), "model",
                 "must be a path to a local model directory")
        _require(self.load_format in LOAD_FORMATS, "load_format",
                 f"must be one of {LOAD_FORMATS}, got {self.load_format!r}")
        if self.model.endswith(".json"):
            _require(self.load_format == "dummy", "model",
                     f"{self.model!r} is a config file, which holds no weights: use load_format='dummy'")
            _require(self.skip_tokenizer_init or self.tokenizer is not None, "skip_tokenizer_init",
                     f"model {self.model!r} is a config file with no tokenizer: set skip_tokenizer_init=True "
                     "(prompts as token ids) or tokenizer=<a model directory>")
        _require(self.dtype in DTYPES, "dtype", f"must be one of {DTYPES}, got {self.dtype!r}")
        _positive_or_none(self.max_model_len, "max_model_len")
        _require(isinstance(self.seed, int), "seed", f"must be an integer, got {self.seed!r}")
        _require(isinstance(self.max_logprobs, int) and self.max_logprobs >= 0, "max_logprobs",
                 f"must be an integer >= 0, got {self.max_logprobs!r}")


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV cache: block size, how many blocks, prefix caching."""

    block_size: int = 16
    num_kv_blocks: int | None = None  # wins over kv_cache_memory_bytes when both are set
    kv_cache_memory_bytes: int | None = None  # None on CPU: DEFAULT_CPU_KV_BYTES
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = 0.9  # CUDA: share of GPU memory for weights + activations + KV cache

    def __post_init__(self) -> None:
        _require(isinstance(self.block_size, int) and self.block_size in (1, 2, 4, 8, 16, 32, 64, 128),
                 "block_size", f"must be a power of two in [1, 128], got {self.block_size!r}")
        _positive_or_none(self.num_kv_blocks, "num_kv_blocks")
        if self.num_kv_blocks is not None:
            _require(self.num_kv_blocks >= 2, "num_kv_blocks",
                     f"must be >= 2 (block 0 is the reserved null block), got {self.num_kv_blocks}")
        _positive_or_none(self.kv_cache_memory_bytes, "kv_cache_memory_bytes")
        util = self.gpu_memory_utilization
        _require(isinstance(util, (int, float)) and not isinstance(util, bool) and 0 < util <= 1,
                 "gpu_memory_utilization", f"must be a number in (0, 1], got {util!r}")


DEFAULT_CPU_KV_BYTES = 1 << 30


@dataclass(frozen=True)
class SchedulerConfig:
    """One token budget per step, and a cap on concurrently running requests.

    None: the engine picks by device and usage (lamina/engine/defaults.py) and logs what it picked."""

    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs"):
            value = getattr(self, name)
            _require(value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0),
                     name, f"must be a positive integer or None (the device's default), got {value!r}")


@dataclass(frozen=True)
class EngineConfig:
    model_config: ModelConfig
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    device: str = "auto"  # "auto": cuda when available, else cpu
    attention_backend: str = "auto"
    enforce_eager: bool = False  # True: no CUDA graphs (they are used on CUDA with the triton backend)
    cuda_graph_max_batch_size: int = 256  # decode batches up to this size are captured
    # Launch the next decode step before the current one's tokens reach the host (scheduler.schedule_ahead)
    async_scheduling: bool = True

    def __post_init__(self) -> None:
        _require(self.device in DEVICES, "device", f"must be one of {DEVICES}, got {self.device!r}")
        _require(self.attention_backend in ATTENTION_BACKENDS, "attention_backend",
                 f"must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}")
        _require(isinstance(self.enforce_eager, bool), "enforce_eager",
                 f"must be a bool, got {self.enforce_eager!r}")
        _require(isinstance(self.async_scheduling, bool), "async_scheduling",
                 f"must be a bool, got {self.async_scheduling!r}")
        size = self.cuda_graph_max_batch_size
        _require(isinstance(size, int) and not isinstance(size, bool) and size > 0,
                 "cuda_graph_max_batch_size", f"must be a positive integer, got {size!r}")
