"""Reading quantization_config: what is accepted, what is refused (naming the field), and which layers
get which method."""
from __future__ import annotations

import copy

import pytest

from lamina.layers.embedding import ParallelLMHead, VocabEmbedding
from lamina.layers.linear import QKVParallelLinear, RowParallelLinear
from lamina.quant.compressed_tensors import config_dict
from lamina.quant.config import WeightQuantArgs, parse_quant_config, shard_names
from lamina.quant.wna16 import WNA16LinearMethod

INT4 = WeightQuantArgs(num_bits=4, symmetric=False, strategy="group", group_size=128)
BASE = config_dict(INT4, ["lm_head"])


def _edited(path: str, value: object) -> dict:
    raw = copy.deepcopy(BASE)
    *parents, leaf = path.split(".")
    node = raw
    for key in parents:
        node = node[key]
    node[leaf] = value
    return raw


def test_lamina_config_round_trips():
    config = parse_quant_config(BASE)
    assert config.schemes[0].weights == INT4 and config.ignore == ("lm_head",)
    assert parse_quant_config(None) is None and parse_quant_config({}) is None


@pytest.mark.parametrize("path,value,message", [
    ("quant_method", "bitsandbytes", r"quant_method: 'bitsandbytes' is not supported"),
    ("config_groups.group_0.weights.type", "mxfp", r"weights\.type: only 'int' and 'float'"),
    ("config_groups.group_0.weights.type", "float", r"weights\.type: 'float' weights cannot be stored as 'pack"),
    ("config_groups.group_0.weights.num_bits", 3, r"weights\.num_bits: only \[4, 8\]"),
    ("config_groups.group_0.weights.strategy", "tensor", r"weights\.strategy: 'tensor' is read for fp8 weights only"),
    ("config_groups.group_0.weights.strategy", "block", r"weights\.strategy: 'block' is not supported"),
    ("config_groups.group_0.weights.group_size", None, r"weights\.group_size: a positive integer"),
    ("config_groups.group_0.weights.actorder", "group", r"weights\.actorder: 'group' needs weight_g_idx"),
    ("config_groups.group_0.weights.dynamic", True, r"weights\.dynamic"),
    ("config_groups.group_0.input_activations", {"num_bits": 8}, r"input_activations: dynamic symmetric per-token "
                                                                  r"scales, or \(fp8\) one static"),
    ("config_groups.group_0.output_activations", {"num_bits": 8}, r"output_activations: output quantization"),
    ("config_groups.group_0.format", "float-quantized", r"weights\.type: 'int' weights cannot be stored as 'float"),
    ("config_groups.group_0.format", "int-quantized", r"'int-quantized' does not fit a scheme without input_act"),
    ("config_groups.group_0.format", "marlin-24", r"format: 'marlin-24' is not supported"),
    ("config_groups.group_0.targets", [], r"targets: expected a non-empty list"),
    ("kv_cache_scheme", {"num_bits": 8}, r"kv_cache_scheme.type: lamina reads static symmetric fp8"),
    ("quantization_status", "frozen", r"quantization_status: only 'compressed'"),
    ("config_groups", {}, r"config_groups: expected a non-empty"),
])
def test_unsupported_configs_are_clear_errors(path, value, message):
    with pytest.raises(ValueError, match=message):
        parse_quant_config(_edited(path, value))


def test_mixed_precision_groups_carry_their_own_format():
    raw = _edited("format", "mixed-precision")
    assert parse_quant_config(raw).schemes[0].weights.layout == "pack-quantized"
    raw["config_groups"]["group_0"].pop("format")
    with pytest.raises(ValueError, match=r"group_0\.format: None is not supported"):
        parse_quant_config(raw)


def test_layers_get_methods_by_name_class_and_ignore():
    config = parse_quant_config(BASE)
    assert isinstance(config.get_quant_method(QKVParallelLinear, "model.layers.0.self_attn.qkv_proj"),
                      WNA16LinearMethod)
    assert config.get_quant_method(ParallelLMHead, "lm_head") is None  # ignored
    assert config.get_quant_method(VocabEmbedding, "model.embed_tokens") is None  # not a linear
    assert isinstance(parse_quant_config(_edited("ignore", [])).get_quant_method(ParallelLMHead, "lm_head"),
                      WNA16LinearMethod)


def test_regex_targets_beat_the_class_and_fused_shards_must_agree():
    raw = copy.deepcopy(BASE)
    raw["config_groups"]["group_1"] = {**raw["config_groups"]["group_0"], "targets": ["re:.*down_proj"],
                                       "weights": {**raw["config_groups"]["group_0"]["weights"], "num_bits": 8}}
    config = parse_quant_config(raw)
    assert config.get_quant_method(RowParallelLinear, "model.layers.1.mlp.down_proj").args.num_bits == 8
    assert config.get_quant_method(RowParallelLinear, "model.layers.1.self_attn.o_proj").args.num_bits == 4
    split = parse_quant_config(_edited("ignore", ["lm_head", "re:.*k_proj"]))
    with pytest.raises(ValueError, match="fused shards .* have different schemes"):
        split.get_quant_method(QKVParallelLinear, "model.layers.0.self_attn.qkv_proj")


def test_shard_names():
    assert shard_names("model.layers.2.mlp.gate_up_proj") == ["model.layers.2.mlp.gate_proj",
                                                              "model.layers.2.mlp.up_proj"]
    assert shard_names("lm_head") == ["lm_head"]
