"""The quantization seam: which layers are quantized, and how, read from config.json's `quantization_config`.

    config.json  --parse_quant_config-->  QuantConfig  --get_quant_method(layer, prefix)-->  QuantMethod | None

`QuantConfig` is format-neutral: a list of `QuantScheme`s (targets, weight args and, for W8A8, the input
activations' args) and an ignore list, the compressed-tensors model (lamina/quant/compressed_tensors.py parses
and writes that format). Models pass each layer's class and its checkpoint prefix (`model.layers.3.mlp.down_proj`);
a fused lamina layer (`qkv_proj`, `gate_up_proj`) is matched through its checkpoint shards, which must all agree.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lamina.layers.linear import QuantMethod

# lamina's fused layers (lamina/models/common.py) -> the checkpoint modules they hold, in shard order.
FUSED_MODULES: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
STRATEGIES = ("channel", "group", "tensor")  # tensor: one scale for the whole weight (fp8 only)
WEIGHT_TYPES = ("int", "float")  # float: fp8 e4m3


@dataclass(frozen=True)
class WeightQuantArgs:
    """How a weight is quantized: num_bits-bit integers (or fp8 e4m3 values), w = (q - zero_point) * scale.

    strategy "channel": one scale (and zero point) per output row; "group": one per `group_size` input
    columns of a row; "tensor" (fp8 only, llm-compressor's FP8 scheme): one for the whole weight. `layout` is
    how the checkpoint stores q: "pack-quantized" (int32 words, lamina/quant/packing.py) or one value per
    element: "naive-quantized" / "int-quantized" (int8), "float-quantized" (float8_e4m3fn), the names
    compressed-tensors gives them.
    """

    num_bits: int
    symmetric: bool
    strategy: str
    group_size: int | None = None
    layout: str = "pack-quantized"
    type: str = "int"

    def __post_init__(self) -> None:
        if self.type not in WEIGHT_TYPES:
            raise ValueError(f"weights.type: {self.type!r} is not supported; supported: {list(WEIGHT_TYPES)}")
        if self.type == "float" and (self.num_bits != 8 or not self.symmetric
                                     or self.strategy not in ("channel", "tensor")):
            raise ValueError(f"weights: float weights are read as fp8 e4m3, symmetric, one scale per channel or per "
                             f"tensor; got num_bits {self.num_bits}, symmetric {self.symmetric}, "
                             f"strategy {self.strategy!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"weights.strategy: {self.strategy!r} is not supported; supported: {list(STRATEGIES)}")
        if self.strategy == "tensor" and self.type != "float":
            raise ValueError("weights.strategy: 'tensor' is read for fp8 weights only; integer weights take "
                             "'channel' or 'group'")
        if self.strategy == "group" and (not isinstance(self.group_size, int) or self.group_size <= 0):
            raise ValueError(f"weights.group_size: a positive integer is needed for strategy 'group', "
                             f"got {self.group_size!r}")
        if self.strategy in ("channel", "tensor") and self.group_size not in (None, -1):
            raise ValueError(f"weights.group_size: must be null for strategy {self.strategy!r}, "
                             f"got {self.group_size!r}")

    def num_groups(self, input_size: int, what: str = "layer") -> int:
        """Scale columns of a weight with `input_size` input features (1 per row for "channel" and "tensor")."""
        if self.strategy in ("channel", "tensor"):
            return 1
        assert self.group_size is not None
        if input_size % self.group_size:
            raise ValueError(f"{what}: input size {input_size} is not a multiple of weights.group_size "
                             f"{self.group_size}")
        return input_size // self.group_size


@dataclass(frozen=True)
class ActivationQuantArgs:
    """How a linear's input is quantized at run time (W8A8): 8-bit int or fp8 e4m3, symmetric, with one scale per
    token computed from the token itself ("token", dynamic), or, fp8 only, one static scale per layer calibrated
    into the checkpoint ("tensor", not dynamic: `input_scale`, llm-compressor's FP8 scheme)."""

    type: str  # "int" or "float"
    num_bits: int = 8
    strategy: str = "token"
    dynamic: bool = True
    symmetric: bool = True

    def __post_init__(self) -> None:
        if self.type not in WEIGHT_TYPES or self.num_bits != 8:
            raise ValueError(f"input_activations: 8-bit 'int' or 'float' is supported, got {self.num_bits}-bit "
                             f"{self.type!r}")
        static_fp8 = (self.type, self.strategy, self.dynamic) == ("float", "tensor", False)
        if not self.symmetric or not (static_fp8 or (self.strategy == "token" and self.dynamic)):
            raise ValueError(f"input_activations: dynamic symmetric per-token scales, or (fp8) one static "
                             f"symmetric per-tensor scale, are supported; got type {self.type!r}, strategy "
                             f"{self.strategy!r}, dynamic {self.dynamic!r}, symmetric {self.symmetric!r}")

    @property
    def static(self) -> bool:
        """One scale per layer from the checkpoint (`input_scale`), not one per token computed at run time."""
        return not self.dynamic


@dataclass(frozen=True)
class QuantScheme:
    targets: tuple[str, ...]  # "Linear" (every linear layer), "re:<regex>" or an exact module name
    weights: WeightQuantArgs
    input_activations: ActivationQuantArgs | None = None  # None: weight-only (W4A16, W8A16)

    def __post_init__(self) -> None:
        acts = self.input_activations
        if acts is None and self.weights.type == "float":
            raise ValueError("input_activations: fp8 weights are read with fp8 activations (FP8 W8A8) only")
        if acts is not None and (acts.type != self.weights.type or self.weights.num_bits != 8
                                 or self.weights.strategy not in ("channel", "tensor") or not self.weights.symmetric):
            raise ValueError(f"input_activations: W8A8 needs 8-bit symmetric per-channel weights (fp8: or "
                             f"per-tensor) of the same type as the activations ({acts.type!r}), got {self.weights}")


SchemeArgs = tuple[WeightQuantArgs, ActivationQuantArgs | None]  # a layer's weight and input activation args


@dataclass(frozen=True)
class QuantConfig:
    """A checkpoint's quantization: schemes matched against layers, minus `ignore` (same target syntax)."""

    quant_method: str
    schemes: tuple[QuantScheme, ...]
    ignore: tuple[str, ...] = ()
    llm_int8_threshold: float | None = None  # lamina's LLM.int8() marker (lamina/quant/llm_int8.py)
    kv_cache_scheme: str | None = None  # "fp8": the checkpoint carries static fp8 KV scales (self_attn.k_scale)

    def __post_init__(self) -> None:
        if self.llm_int8_threshold is None:
            return
        if not isinstance(self.llm_int8_threshold, (int, float)) or self.llm_int8_threshold <= 0:
            raise ValueError(f"quantization_config.lamina_llm_int8.threshold: a positive number is needed, "
                             f"got {self.llm_int8_threshold!r}")
        for scheme in self.schemes:
            w = scheme.weights
            if scheme.input_activations is not None or (w.type, w.num_bits, w.symmetric, w.strategy) != (
                    "int", 8, True, "channel"):
                raise ValueError("quantization_config.lamina_llm_int8: LLM.int8() runs on W8A16 schemes (int8, "
                                 f"symmetric, per channel, no input_activations), got {scheme}")

    def scheme_for(self, layer_class: str, names: list[str]) -> WeightQuantArgs | None:
        """The weight args of the module(s) `names` (one, or a fused layer's shards), or None: unquantized."""
        args = self.args_for(layer_class, names)
        return None if args is None else args[0]

    def args_for(self, layer_class: str, names: list[str]) -> SchemeArgs | None:
        """(weight args, input activation args) of the module(s) `names`, or None: unquantized."""
        found = {name: self._scheme_of_one(layer_class, name) for name in names}
        if len(set(found.values())) > 1:
            raise ValueError(f"quantization_config: the fused shards {names} have different schemes ({found}); "
                             f"lamina fuses them into one layer, so they must be quantized alike")
        return found[names[0]]

    def _scheme_of_one(self, layer_class: str, name: str) -> SchemeArgs | None:
        if any(_matches(target, layer_class, name) for target in self.ignore):
            return None
        for rank in (_exact, _regex, _klass):  # an exact name beats a regex beats a class name
            for scheme in self.schemes:
                if any(rank(target, layer_class, name) for target in scheme.targets):
                    return scheme.weights, scheme.input_activations
        return None

    def get_quant_method(self, layer: type, prefix: str) -> QuantMethod | None:
        """The method for a layer of class `layer` whose checkpoint name is `prefix`; None = unquantized.

        Linear layers (lamina.layers.linear's, and the LM head) are matched; anything else is never quantized.
        Weight-only schemes run in wna16.py (llm_int8.py with the LLM.int8() marker), W8A8 int8 in
        w8a8_int8.py, FP8 W8A8 in fp8.py.
        """
        if not _is_linear(layer):
            return None
        found = self.args_for("Linear", shard_names(prefix))
        if found is None:
            return None
        weights, activations = found
        if activations is None and self.llm_int8_threshold is not None:
            from lamina.quant.llm_int8 import LLMInt8LinearMethod
            return LLMInt8LinearMethod(weights, self.llm_int8_threshold)
        if activations is None:
            from lamina.quant.wna16 import WNA16LinearMethod
            return WNA16LinearMethod(weights)
        if activations.type == "int":
            from lamina.quant.w8a8_int8 import W8A8Int8LinearMethod
            return W8A8Int8LinearMethod(weights)
        from lamina.quant.fp8 import Fp8LinearMethod
        return Fp8LinearMethod(weights, static_input=activations.static)


def shard_names(prefix: str) -> list[str]:
    """A layer's checkpoint module names: a fused layer's shards, or the prefix itself."""
    parent, _, leaf = prefix.rpartition(".")
    shards = FUSED_MODULES.get(leaf)
    if shards is None:
        return [prefix]
    return [f"{parent}.{shard}" if parent else shard for shard in shards]


def _is_linear(layer: type) -> bool:
    from lamina.layers.embedding import ParallelLMHead
    from lamina.layers.linear import LinearBase

    return isinstance(layer, type) and issubclass(layer, (LinearBase, ParallelLMHead))


def _exact(target: str, layer_class: str, name: str) -> bool:
    return target == name


def _regex(target: str, layer_class: str, name: str) -> bool:
    return target.startswith("re:") and re.match(target[3:], name) is not None


def _klass(target: str, layer_class: str, name: str) -> bool:
    return target == layer_class


def _matches(target: str, layer_class: str, name: str) -> bool:
    return _exact(target, layer_class, name) or _regex(target, layer_class, name) or _klass(target, layer_class, name)


def parse_quant_config(raw: dict[str, Any] | None) -> QuantConfig | None:
    """config.json's `quantization_config` -> QuantConfig (None when absent); ValueError naming the field
    for a method, format or scheme lamina does not run."""
    if not raw:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"quantization_config: expected a JSON object, got {type(raw).__name__}")
    from lamina.quant import awq_format, compressed_tensors, gptq_format

    parsers = {compressed_tensors.QUANT_METHOD: compressed_tensors.parse_config,
               gptq_format.QUANT_METHOD: gptq_format.parse_config, awq_format.QUANT_METHOD: awq_format.parse_config}
    method = raw.get("quant_method")
    if method not in parsers:
        raise ValueError(f"quantization_config.quant_method: {method!r} is not supported; "
                         f"supported: {sorted(parsers)}")
    return parsers[method](raw)
