"""The compressed-tensors checkpoint format (what vLLM, transformers and llm-compressor read and write).

config.json:

    "quantization_config": {
      "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
      "config_groups": {"group_0": {"targets": ["Linear"], "format": "pack-quantized",
                                    "weights": {"num_bits": 4, "type": "int", "symmetric": false,
                                                "strategy": "group", "group_size": 128, "dynamic": false, ...},
                                    "input_activations": null, "output_activations": null}},
      "ignore": ["lm_head"], "kv_cache_scheme": null, "sparsity_config": {}, "transform_config": {}}

Tensors of a quantized linear `X` (w = (q - zero_point) * scale; q signed, in [-2^(b-1), 2^(b-1) - 1]):

    pack-quantized:   X.weight_packed      int32 [out, ceil(in * b / 32)]   (lamina/quant/packing.py, dim 1)
                      X.weight_scale       float [out, groups]              (groups = 1 for "channel")
                      X.weight_zero_point  int32 [ceil(out * b / 32), groups], packed along dim 0 (asymmetric only)
                      X.weight_shape       int64 [2] = (out, in)
    naive-quantized:  X.weight int8 [out, in], X.weight_scale, X.weight_zero_point int8 [out, groups] (asymmetric)
    int-quantized:    as naive-quantized (W8A8 int8: the scheme has input_activations)
    float-quantized:  X.weight float8_e4m3fn [out, in], X.weight_scale [out, 1] (FP8 W8A8)

Read here: weight-only integer schemes (W4A16 / W8A16, "channel" or "group"), W8A8 int8 and fp8 with
dynamic per-token input activations, fp8 with per-tensor weight scales and static per-tensor input scales
(`X.input_scale`, llm-compressor's FP8 scheme), and lamina's LLM.int8() marker, a top-level key that compressed-tensors
and vLLM ignore (they serve the checkpoint as the W8A16 it also is):

    "quantization_config": {..., "lamina_llm_int8": {"threshold": 6.0}}

An fp8 KV cache's static scales (llm-compressor's `kv_cache_scheme`; with no config_groups the checkpoint holds
only them):

    "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor" | "attn_head", "dynamic": false,
                        "symmetric": true}
    model.layers.N.self_attn.k_scale / v_scale   float [1] or [num_kv_heads, 1, 1]   (x = e4m3 * scale)

They are used when the engine runs with kv_cache_dtype="fp8" (as in vLLM), read and unused otherwise.

Anything else is a ValueError naming the field, never a silent fallback.
"""
from __future__ import annotations

from typing import Any

import torch

from lamina.quant.config import ActivationQuantArgs, QuantConfig, QuantScheme, WeightQuantArgs
from lamina.quant.packing import check_num_bits, pack_int32

QUANT_METHOD = "compressed-tensors"
LAYOUTS = ("pack-quantized", "naive-quantized", "int-quantized", "float-quantized")
LLM_INT8_KEY = "lamina_llm_int8"
_EMPTY = (None, {}, [])
_ACTORDERS = (None, "weight", "static")


def _field(raw: dict[str, Any], key: str, what: str) -> Any:
    if key not in raw:
        raise ValueError(f"{what}.{key}: missing")
    return raw[key]


def _weight_args(raw: Any, layout: str, what: str) -> WeightQuantArgs:
    if not isinstance(raw, dict):
        raise ValueError(f"{what}: expected a JSON object, got {raw!r}")
    kind = raw.get("type", "int")
    if kind not in ("int", "float"):
        raise ValueError(f"{what}.type: only 'int' and 'float' (fp8) weights are supported, got {kind!r}")
    num_bits = _field(raw, "num_bits", what)
    if kind == "int":
        check_num_bits(num_bits, f"{what}.num_bits")
    if (kind == "float") != (layout == "float-quantized"):
        raise ValueError(f"{what}.type: {kind!r} weights cannot be stored as {layout!r}")
    if raw.get("dynamic", False):
        raise ValueError(f"{what}.dynamic: dynamic weight quantization is not supported, got {raw['dynamic']!r}")
    if raw.get("actorder") not in _ACTORDERS:  # "weight" / "static" reorder while quantizing, not at run time
        raise ValueError(f"{what}.actorder: {raw['actorder']!r} needs weight_g_idx, which lamina does not read "
                         f"yet (supported: {list(_ACTORDERS)})")
    if raw.get("block_structure") is not None:
        raise ValueError(f"{what}.block_structure: block quantization is not supported")
    group_size = raw.get("group_size")
    return WeightQuantArgs(num_bits=num_bits, symmetric=bool(raw.get("symmetric", True)),
                           strategy=_field(raw, "strategy", what),
                           group_size=None if group_size in (None, -1) else group_size, layout=layout, type=kind)


def _activation_args(raw: Any, what: str) -> ActivationQuantArgs | None:
    if raw in _EMPTY:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"{what}: expected a JSON object, got {raw!r}")
    for key in ("group_size", "block_structure"):
        if raw.get(key) not in (None, -1):
            raise ValueError(f"{what}.{key}: not supported for activations, got {raw[key]!r}")
    try:
        return ActivationQuantArgs(type=raw.get("type", "int"), num_bits=_field(raw, "num_bits", what),
                                   strategy=raw.get("strategy"), dynamic=raw.get("dynamic") is True,
                                   symmetric=bool(raw.get("symmetric", True)))
    except ValueError as exc:
        raise ValueError(f"{what}: {str(exc).partition(': ')[2]}") from None


def _scheme(name: str, raw: Any, default_layout: str | None) -> QuantScheme:
    what = f"quantization_config.config_groups.{name}"
    if not isinstance(raw, dict):
        raise ValueError(f"{what}: expected a JSON object")
    if raw.get("output_activations") not in _EMPTY:
        raise ValueError(f"{what}.output_activations: output quantization is not supported")
    layout = raw.get("format") or default_layout
    if layout not in LAYOUTS:
        raise ValueError(f"{what}.format: {layout!r} is not supported; supported: {list(LAYOUTS)}")
    targets = raw.get("targets")
    if not targets or not isinstance(targets, list):
        raise ValueError(f"{what}.targets: expected a non-empty list, got {targets!r}")
    weights = _weight_args(raw.get("weights"), layout, f"{what}.weights")
    activations = _activation_args(raw.get("input_activations"), f"{what}.input_activations")
    if (activations is None) == (layout in ("int-quantized", "float-quantized")):
        raise ValueError(f"{what}.format: {layout!r} does not fit a scheme "
                         f"{'without' if activations is None else 'with'} input_activations")
    try:
        return QuantScheme(tuple(targets), weights, activations)
    except ValueError as exc:
        raise ValueError(f"{what}.{exc}") from None


_KV_STRATEGIES = ("tensor", "attn_head")  # one scale per layer, or one per KV head


def _kv_cache_scheme(raw: Any) -> str | None:
    """`kv_cache_scheme` -> "fp8" (static e4m3 scales, self_attn.k_scale / v_scale in the checkpoint) or None."""
    what = "quantization_config.kv_cache_scheme"
    if raw in _EMPTY:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"{what}: expected a JSON object, got {raw!r}")
    wanted = {"type": ("float",), "num_bits": (8,), "symmetric": (True,), "dynamic": (False,),
              "strategy": _KV_STRATEGIES}
    for key, allowed in wanted.items():
        if raw.get(key) not in allowed:
            raise ValueError(f"{what}.{key}: lamina reads static symmetric fp8 (e4m3) KV scales, per tensor or per "
                             f"KV head; allowed: {list(allowed)}, got {raw.get(key)!r}")
    if raw.get("group_size") not in (None, -1):
        raise ValueError(f"{what}.group_size: not supported for the KV cache, got {raw['group_size']!r}")
    return "fp8"


def parse_config(raw: dict[str, Any]) -> QuantConfig:
    """A compressed-tensors `quantization_config` -> QuantConfig; ValueError naming what is not supported."""
    for key in ("sparsity_config", "transform_config"):
        if raw.get(key) not in _EMPTY:
            raise ValueError(f"quantization_config.{key}: not supported yet, got {raw[key]!r}")
    kv_cache_scheme = _kv_cache_scheme(raw.get("kv_cache_scheme"))
    status = raw.get("quantization_status", "compressed")
    if status != "compressed":
        raise ValueError(f"quantization_config.quantization_status: only 'compressed' checkpoints are read, "
                         f"got {status!r}")
    top_format = raw.get("format")
    default = top_format if top_format in LAYOUTS else None  # "mixed-precision": each group names its own
    groups = raw.get("config_groups")
    if kv_cache_scheme is not None and groups in _EMPTY:
        groups = {}  # the KV cache's scales only: every linear stays in the model's dtype
    elif not groups or not isinstance(groups, dict):
        raise ValueError("quantization_config.config_groups: expected a non-empty JSON object")
    schemes = tuple(_scheme(name, group, default) for name, group in groups.items())
    ignore = raw.get("ignore") or []
    if not isinstance(ignore, list):
        raise ValueError(f"quantization_config.ignore: expected a list, got {ignore!r}")
    marker = raw.get(LLM_INT8_KEY)
    if marker is not None and (not isinstance(marker, dict) or "threshold" not in marker):
        raise ValueError(f"quantization_config.{LLM_INT8_KEY}: expected {{'threshold': <number>}}, got {marker!r}")
    return QuantConfig(quant_method=QUANT_METHOD, schemes=schemes, ignore=tuple(ignore),
                       llm_int8_threshold=None if marker is None else marker["threshold"],
                       kv_cache_scheme=kv_cache_scheme)


def weights_dict(args: WeightQuantArgs) -> dict[str, Any]:
    """The `weights` entry of a config group, with every field compressed-tensors' QuantizationArgs has."""
    return {"num_bits": args.num_bits, "type": args.type, "symmetric": args.symmetric, "strategy": args.strategy,
            "group_size": args.group_size, "block_structure": None, "dynamic": False, "actorder": None,
            "observer": "minmax", "observer_kwargs": {}}


def activations_dict(args: ActivationQuantArgs) -> dict[str, Any]:
    """An `input_activations` entry (dynamic per-token scales: no observer, as llm-compressor writes them)."""
    return {"num_bits": args.num_bits, "type": args.type, "symmetric": args.symmetric, "strategy": args.strategy,
            "group_size": None, "block_structure": None, "dynamic": args.dynamic, "actorder": None,
            "observer": None, "observer_kwargs": {}}


def config_dict(args: WeightQuantArgs, ignore: list[str], activations: ActivationQuantArgs | None = None,
                llm_int8_threshold: float | None = None) -> dict[str, Any]:
    """The `quantization_config` lamina writes: one group targeting every Linear except `ignore`."""
    group = {"targets": ["Linear"], "weights": weights_dict(args),
             "input_activations": None if activations is None else activations_dict(activations),
             "output_activations": None, "format": args.layout}
    config = {"quant_method": QUANT_METHOD, "format": args.layout, "quantization_status": "compressed",
              "config_groups": {"group_0": group}, "ignore": list(ignore), "kv_cache_scheme": None,
              "sparsity_config": {}, "transform_config": {}, "global_compression_ratio": None}
    if llm_int8_threshold is not None:
        config[LLM_INT8_KEY] = {"threshold": llm_int8_threshold}
    return config


def compressed_tensors_of(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None,
                          args: WeightQuantArgs) -> dict[str, torch.Tensor]:
    """One linear's checkpoint tensors (suffixes after `X.`) from its integers q [out, in] (int8; fp8 e4m3 for
    "float-quantized"), its scales [out, groups] and, when asymmetric, its zero points [out, groups] (int8)."""
    tensors: dict[str, torch.Tensor] = {"weight_scale": scale.contiguous()}
    if args.layout == "pack-quantized":
        tensors["weight_packed"] = pack_int32(q, args.num_bits, dim=1)
        tensors["weight_shape"] = torch.tensor(list(q.shape), dtype=torch.int64)
        if not args.symmetric:
            tensors["weight_zero_point"] = pack_int32(zero_point, args.num_bits, dim=0)
    else:
        tensors["weight"] = (q if args.type == "float" else q.to(torch.int8)).contiguous()
        if not args.symmetric:
            tensors["weight_zero_point"] = zero_point.to(torch.int8).contiguous()
    return tensors
