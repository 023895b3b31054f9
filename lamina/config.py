"""Engine configuration: small frozen dataclasses, validated on construction.

Fields use vLLM's names so a reader who knows one engine can map them 1:1. The CLI builds its
flags from these fields, and `engine_config(**kwargs)` routes flat keyword arguments (LLM's) to them;
nothing in core code reads environment variables. This module is a leaf: it imports nothing of lamina
(and not torch), so every layer of the package may import it.
"""
from __future__ import annotations

import ast
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

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


KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")  # vLLM's names; both fp8 names mean e4m3


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV cache: block size, how many blocks, prefix caching."""

    block_size: int = 16
    num_kv_blocks: int | None = None  # wins over kv_cache_memory_bytes when both are set
    kv_cache_memory_bytes: int | None = None  # None on CPU: DEFAULT_CPU_KV_BYTES
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = 0.9  # CUDA: share of GPU memory for weights + activations + KV cache
    # "auto": the model's dtype; "fp8" (= "fp8_e4m3"): e4m3 K/V with per-head scales from the checkpoint
    # (self_attn.k_scale / v_scale, `lamina quantize --kv-cache-dtype fp8`), 1.0 where it has none
    kv_cache_dtype: str = "auto"

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
        _require(self.kv_cache_dtype in KV_CACHE_DTYPES, "kv_cache_dtype",
                 f"must be one of {list(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")


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


SPEC_METHODS = ("ngram", "draft_model", "medusa", "early_exit", "eagle")
MODEL_SPEC_METHODS = ("draft_model", "medusa", "eagle")  # the methods that read weights from `model`
MAX_SPEC_TOKENS = 7  # a verify step computes 1 + k tokens a request; the paged decode kernel takes up to 8
MAX_TREE_NODES = 63  # speculative_token_tree: nodes verified a request (the torch attention path has no cap of 8)
TREE_METHODS = ("draft_model", "medusa", "eagle")  # the proposers that draft trees so far
# num_speculative_tokens when not given: n-gram drafts cost nothing to make and a repeat runs on (7 beat 3 at batch
# 1 on the H200: docs/speculative.md, "Adaptive speculation"); a network's drafts cost a step each
DEFAULT_SPEC_TOKENS = {"ngram": 7}
DEFAULT_MODEL_SPEC_TOKENS = 3


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (vLLM's `speculative_config`): drafts of `num_speculative_tokens` tokens verified in
    one forward. "ngram" drafts by prompt lookup: the tokens that followed the latest earlier occurrence of the
    sequence's last n tokens, n from prompt_lookup_max down to prompt_lookup_min. "draft_model": a smaller
    checkpoint with the target's tokenizer (`model`) drafts greedily. "medusa": residual heads on the target's
    last hidden state (`model`: a directory written by `lamina distill --method medusa`). "early_exit": the
    target's first `exit_layer` layers, its final norm and LM head draft (no extra weights). "eagle": an EAGLE-3
    head (`model`: a directory written by `lamina distill --method eagle`), one decoder layer over the target's
    features from three of its layers and the next token's embedding, drafting a chain with the target's LM head."""

    method: str = "ngram"
    num_speculative_tokens: int | None = None  # None: DEFAULT_SPEC_TOKENS of the method (7 for n-gram, else 3)
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    model: str | None = None  # draft_model / medusa / eagle: the checkpoint directory
    exit_layer: int | None = None  # early_exit: layers that draft (None: a third of the target's, at least 1)
    # True: each step, each request drafts as many tokens as pay off by the measured step costs and its acceptance
    # (lamina/engine/spec_policy.py), none when verifying costs more than it saves; False: always up to k
    adaptive: bool = True
    # tree drafts (lamina/spec/draft_tree.py): paths of ranks, e.g. [(0,), (1,), (0, 0)] or that as a string (vLLM's
    # format); None: a chain of num_speculative_tokens. With a tree, num_speculative_tokens is its number of nodes.
    speculative_token_tree: tuple[tuple[int, ...], ...] | None = None
    # n-gram, greedy requests: while a step verifies drafts, launch the next one on the guess that they are all
    # accepted and the token after them is the lookup's (lamina/engine/speculator.py; a failed guess voids that
    # step). Pays where outputs repeat themselves or their input, on a GPU (docs/speculative.md); off by default
    guess_ahead: bool = False

    def __post_init__(self) -> None:
        _require(self.method in SPEC_METHODS, "method",
                 f"must be one of {SPEC_METHODS} (the methods lamina has so far), got {self.method!r}")
        if self.speculative_token_tree is not None:
            self._set_tree()
        if self.num_speculative_tokens is None:
            object.__setattr__(self, "num_speculative_tokens",
                               DEFAULT_SPEC_TOKENS.get(self.method, DEFAULT_MODEL_SPEC_TOKENS))
        k = self.num_speculative_tokens
        most = MAX_SPEC_TOKENS if self.speculative_token_tree is None else MAX_TREE_NODES
        _require(_is_int(k) and 1 <= k <= most, "num_speculative_tokens",
                 f"must be an integer in [1, {most}], got {k!r}")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        _require(_is_int(lo) and lo >= 1, "prompt_lookup_min", f"must be an integer >= 1, got {lo!r}")
        _require(_is_int(hi) and hi >= lo, "prompt_lookup_max",
                 f"must be an integer >= prompt_lookup_min ({lo}), got {hi!r}")
        needs_model = self.method in MODEL_SPEC_METHODS
        _require((self.model is not None) == needs_model, "model",
                 f"a checkpoint directory is needed by {MODEL_SPEC_METHODS} and by no other method "
                 f"(method {self.method!r}), got {self.model!r}")
        _require(self.model is None or isinstance(self.model, str), "model", f"must be a path, got {self.model!r}")
        _require(isinstance(self.adaptive, bool), "adaptive", f"must be true or false, got {self.adaptive!r}")
        _require(self.guess_ahead is False or (self.guess_ahead is True and self.method == "ngram"), "guess_ahead",
                 f"must be false, or true with method 'ngram' (the drafts a host proposes), got "
                 f"{self.guess_ahead!r} with method {self.method!r}")
        exit_layer = self.exit_layer
        _require(exit_layer is None or (self.method == "early_exit" and _is_int(exit_layer) and exit_layer >= 1),
                 "exit_layer", f"must be None, or an integer >= 1 with method 'early_exit', got {exit_layer!r}")

    def _set_tree(self) -> None:
        tree = _tree_paths(self.speculative_token_tree)
        _require(self.method in TREE_METHODS, "speculative_token_tree",
                 f"tree drafts are made by {TREE_METHODS} so far, not by method {self.method!r}")
        k = self.num_speculative_tokens
        _require(k is None or k == len(tree), "num_speculative_tokens",
                 f"must be the tree's number of nodes ({len(tree)}) or None with speculative_token_tree, got {k!r}")
        object.__setattr__(self, "speculative_token_tree", tree)
        object.__setattr__(self, "num_speculative_tokens", len(tree))

    @property
    def verify_query_lens(self) -> tuple[int, ...]:
        """The query lengths a request's rows are captured at in CUDA graphs: 1 (decode), 1 + k (k drafts) and,
        for k > 3, 4 too, so that the adaptive policy may verify 3 drafts without padding every row to 1 + k."""
        k = self.num_speculative_tokens
        return (1, *sorted({1 + min(k, 3), 1 + k}))

    @classmethod
    def from_user(cls, value: object) -> SpeculativeConfig | None:
        """None, a SpeculativeConfig, a dict of its fields, or that dict as JSON (the CLI's string)."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as err:
                raise ValueError(f"speculative_config: not valid JSON ({err.msg}): {value!r}") from None
        _require(isinstance(value, dict), "speculative_config",
                 f"must be a dict of {[f.name for f in dataclasses.fields(cls)]}, got {value!r}")
        allowed = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(value) - set(allowed))
        _require(not unknown, "speculative_config", f"unknown key(s) {unknown}; allowed: {allowed}")
        return cls(**value)


def _tree_paths(value: object) -> tuple[tuple[int, ...], ...]:
    """speculative_token_tree as a tuple of paths, validated: a list of paths of ranks (integers >= 0), or its
    string (vLLM's "[(0,), (1,), (0, 0)]"); 1..MAX_TREE_NODES distinct paths, every prefix of a path a path
    too, the children of a node ranked 0, 1, ..., c - 1."""
    name = "speculative_token_tree"
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise ValueError(f"{name}: not a list of paths such as [(0,), (1,), (0, 0)]: {value!r}") from None
    _require(isinstance(value, (list, tuple)) and 1 <= len(value) <= MAX_TREE_NODES, name,
             f"must be a list of 1 to {MAX_TREE_NODES} paths such as [(0,), (1,), (0, 0)], got {value!r}")
    paths = []
    for path in value:
        _require(isinstance(path, (list, tuple)) and len(path) >= 1 and all(_is_int(r) and r >= 0 for r in path),
                 name, f"each path must be a non-empty list of ranks (integers >= 0), got {path!r}")
        paths.append(tuple(path))
    known = set(paths)
    _require(len(known) == len(paths), name, f"has a path twice: {value!r}")
    for path in paths:
        _require(path[:-1] in known or len(path) == 1, name, f"path {path} needs its parent {path[:-1]} in the tree")
        _require(path[-1] == 0 or path[:-1] + (path[-1] - 1,) in known, name,
                 f"path {path} needs its elder sibling {path[:-1] + (path[-1] - 1,)} in the tree")
    return tuple(paths)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class EngineConfig:
    model_config: ModelConfig
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    device: str = "auto"  # "auto": cuda when available, else cpu
    attention_backend: str = "auto"
    enforce_eager: bool = False  # True: no CUDA graphs (they are used on CUDA with the triton backend)
    cuda_graph_max_batch_size: int = 256  # decode batches up to this size are captured
    # Prompt chunks of 1, 2 or 4 rows are captured too, in graphs of up to this many token slots (16, 32, .. tokens a
    # row: lamina/worker/cuda_graphs.py); 0: prompt chunks always run eagerly
    cuda_graph_prefill_tokens: int = 256
    # Launch the next decode step before the current one's tokens reach the host (scheduler.schedule_ahead)
    async_scheduling: bool = True
    # The Triton kernels of a step launch with programmatic dependent launch on sm_90+ GPUs (each starts while the
    # one before it finishes: lamina/kernels/pdl.py); False: one after another (KernelChoice.pdl)
    enable_pdl: bool = True
    # None: off; a SpeculativeConfig, or its fields as a dict or JSON string (vLLM's speculative_config)
    speculative_config: SpeculativeConfig | None = None
    # Tensor parallelism (vLLM's name): the model split over this many ranks, one process per device
    # (lamina/executor/multiproc.py, docs/distributed.md); 1: one process, no torch.distributed
    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        _require(self.device in DEVICES, "device", f"must be one of {DEVICES}, got {self.device!r}")
        _require(_is_int(self.tensor_parallel_size) and self.tensor_parallel_size >= 1, "tensor_parallel_size",
                 f"must be an integer >= 1, got {self.tensor_parallel_size!r}")
        _require(self.attention_backend in ATTENTION_BACKENDS, "attention_backend",
                 f"must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}")
        _require(isinstance(self.enforce_eager, bool), "enforce_eager",
                 f"must be a bool, got {self.enforce_eager!r}")
        _require(isinstance(self.async_scheduling, bool), "async_scheduling",
                 f"must be a bool, got {self.async_scheduling!r}")
        _require(isinstance(self.enable_pdl, bool), "enable_pdl", f"must be a bool, got {self.enable_pdl!r}")
        size = self.cuda_graph_max_batch_size
        _require(isinstance(size, int) and not isinstance(size, bool) and size > 0,
                 "cuda_graph_max_batch_size", f"must be a positive integer, got {size!r}")
        _require(_is_int(self.cuda_graph_prefill_tokens) and self.cuda_graph_prefill_tokens >= 0,
                 "cuda_graph_prefill_tokens", f"must be an integer >= 0, got {self.cuda_graph_prefill_tokens!r}")
        _require(self.tensor_parallel_size == 1 or self.cache_config.kv_cache_dtype == "auto", "kv_cache_dtype",
                 f"{self.cache_config.kv_cache_dtype!r} with tensor_parallel_size > 1 is not supported yet; "
                 "use 'auto'")
        # frozen: the user's dict or JSON becomes the dataclass once, here
        object.__setattr__(self, "speculative_config", SpeculativeConfig.from_user(self.speculative_config))
        spec = self.speculative_config
        _require(spec is None or not spec.guess_ahead or self.async_scheduling, "speculative_config.guess_ahead",
                 "needs async_scheduling (a step is launched on a guess before the one before it is read); "
                 "set async_scheduling=True or guess_ahead=false")


@dataclass(frozen=True)
class ModelArch:
    """The architecture facts lamina needs, parsed once from config.json (lamina.loader.hf_config)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None  # None for plain RoPE; else has "rope_type" (no "rope_theta")
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    torch_dtype: str | None
    sliding_window: int | None  # None when the model attends over the full context
    bos_token_id: int | None
    eos_token_id: int | list[int] | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        eos = self.eos_token_id
        if eos is None:
            return ()
        return tuple(eos) if isinstance(eos, list) else (eos,)


@dataclass(frozen=True)
class KernelChoice:
    """Which optional Triton kernels a model may run and how they launch, fixed when the model is built (all on by
    default).

    A kernel allowed here still runs only where lamina.layers.dispatch finds it applicable (CUDA tensors
    of a dtype it takes, triton importable); off, the layer always runs its PyTorch / cuBLAS path.
    """

    fused_ops: bool = True  # RMSNorm (+ residual add), RoPE, q/k-norm + RoPE, SiLU-and-mul: lamina.kernels.fused_ops
    # decode-sized matmuls: lamina.kernels.gemv instead of cuBLAS (16-bit weights, at most gemv.MAX_M rows); for
    # quantized weights wna16_gemv and wna16_mma (at most wna16_mma.MAX_M rows) instead of dequantize + cuBLAS, and
    # fp8 W8A8's fp8_gemm instead of torch._scaled_mm (where the device's measured table routes to it)
    gemv: bool = True
    # programmatic dependent launch (sm_90+): each kernel above starts while the one before it finishes
    # (lamina.kernels.pdl); off, they launch one after another as any kernel does
    pdl: bool = True

    def __post_init__(self) -> None:
        for name in ("fused_ops", "gemv", "pdl"):
            _require(isinstance(getattr(self, name), bool), name, f"must be a bool, got {getattr(self, name)!r}")


_SECTIONS: dict[str, type] = {"model_config": ModelConfig, "cache_config": CacheConfig,
                              "scheduler_config": SchedulerConfig}


def engine_arg_names() -> tuple[str, ...]:
    """Every flat engine argument: the fields of ModelConfig, CacheConfig, SchedulerConfig and EngineConfig
    (the three section fields of EngineConfig excluded). Names are unique across the four classes."""
    names = [f.name for cls in (*_SECTIONS.values(), EngineConfig) for f in dataclasses.fields(cls)
             if f.name not in _SECTIONS]
    return tuple(names)


def engine_config(**kwargs: Any) -> EngineConfig:
    """An EngineConfig from flat keyword arguments (vLLM's engine arguments: model=..., block_size=...),
    each routed to the config class that has a field of its name; omitted fields keep their defaults.

    A new field of any of the four classes becomes an argument here (and of LLM) with no other edit.
    An unknown name is a TypeError naming it and listing the allowed ones; values are validated by
    the classes themselves (ValueError naming the field).
    """
    allowed = engine_arg_names()
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise TypeError(f"unknown engine argument(s) {unknown}; allowed: {sorted(allowed)}")

    def picked(cls: type) -> dict[str, Any]:
        return {f.name: kwargs[f.name] for f in dataclasses.fields(cls) if f.name in kwargs}

    sections = {name: cls(**picked(cls)) for name, cls in _SECTIONS.items()}
    return EngineConfig(**sections, **picked(EngineConfig))
