"""W8A8 / FP8 / LLM.int8() configs: lamina writes what compressed-tensors' presets say (W8A8, FP8_DYNAMIC),
reads them back to the right runtime method, and refuses what it does not run, naming the field."""
from __future__ import annotations

import copy

import pytest

from lamina.layers.linear import QKVParallelLinear
from lamina.quant.compressed_tensors import config_dict
from lamina.quant.config import parse_quant_config
from lamina.quant.fp8 import Fp8LinearMethod
from lamina.quant.llm_int8 import LLMInt8LinearMethod
from lamina.quant.recipe import get_recipe
from lamina.quant.w8a8_int8 import W8A8Int8LinearMethod
from lamina.quant.wna16 import WNA16LinearMethod

QKV = "model.layers.0.self_attn.qkv_proj"


def _config(method: str) -> dict:
    recipe = get_recipe(method)
    return config_dict(recipe.weight_args(0), ["lm_head"], recipe.input_activations, recipe.llm_int8_threshold)


@pytest.mark.parametrize("method,cls", [("int8", WNA16LinearMethod), ("llm_int8", LLMInt8LinearMethod),
                                        ("w8a8", W8A8Int8LinearMethod), ("fp8", Fp8LinearMethod)])
def test_each_recipe_reads_back_to_its_method(method, cls):
    quant = parse_quant_config(_config(method)).get_quant_method(QKVParallelLinear, QKV)
    assert type(quant) is cls


def test_llm_int8_threshold_is_carried():
    raw = _config("llm_int8")
    raw["lamina_llm_int8"]["threshold"] = 4.5
    assert parse_quant_config(raw).get_quant_method(QKVParallelLinear, QKV).threshold == 4.5


@pytest.mark.parametrize("preset,method", [("W8A8", "w8a8"), ("FP8_DYNAMIC", "fp8")])
def test_lamina_groups_match_compressed_tensors_presets(preset, method):
    presets = pytest.importorskip("compressed_tensors.quantization")
    theirs = presets.preset_name_to_scheme(preset, ["Linear"]).model_dump()
    ours = _config(method)["config_groups"]["group_0"]
    for part in ("weights", "input_activations"):
        for key in ("num_bits", "type", "symmetric", "strategy", "dynamic", "group_size"):
            assert ours[part][key] == theirs[part][key], (part, key)
    presets.QuantizationScheme.model_validate({k: v for k, v in ours.items() if k != "format"})


def _edit(raw: dict, path: str, value: object) -> dict:
    raw = copy.deepcopy(raw)
    *parents, leaf = path.split(".")
    node = raw
    for key in parents:
        node = node[key]
    node[leaf] = value
    return raw


ACTS = "config_groups.group_0.input_activations"


@pytest.mark.parametrize("method,path,value,message", [
    ("w8a8", f"{ACTS}.dynamic", False, r"input_activations: dynamic symmetric per-token scales, or \(fp8\)"),
    ("w8a8", f"{ACTS}.strategy", "tensor", r"input_activations: dynamic symmetric per-token scales, or \(fp8\)"),
    ("fp8", f"{ACTS}.strategy", "tensor", r"input_activations: dynamic symmetric per-token scales, or \(fp8\)"),
    ("fp8", f"{ACTS}.num_bits", 4, r"input_activations: 8-bit 'int' or 'float'"),
    ("w8a8", f"{ACTS}.type", "float", r"group_0\.input_activations: W8A8 needs 8-bit symmetric per-channel weights "
                                      r"\(fp8: or per-tensor\) of the same type"),
    ("w8a8", "config_groups.group_0.weights.symmetric", False, r"input_activations: W8A8 needs 8-bit symmetric"),
    ("fp8", "config_groups.group_0.weights.strategy", "group", r"float weights are read as fp8 e4m3, symmetric, one"),
    ("fp8", f"{ACTS}.group_size", 128, r"input_activations\.group_size: not supported"),
    ("llm_int8", "lamina_llm_int8.threshold", -1, r"lamina_llm_int8\.threshold: a positive number"),
    ("llm_int8", "lamina_llm_int8", 6.0, r"lamina_llm_int8: expected \{'threshold'"),
    ("w8a8", "lamina_llm_int8", {"threshold": 6.0}, r"lamina_llm_int8: LLM\.int8\(\) runs on W8A16 schemes"),
])
def test_unsupported_w8a8_configs_name_the_field(method, path, value, message):
    with pytest.raises(ValueError, match=message):
        parse_quant_config(_edit(_config(method), path, value))
