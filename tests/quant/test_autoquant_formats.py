"""AutoGPTQ / GPTQModel ("gptq") and AutoAWQ GEMM ("awq") checkpoints: packed by the tools' own code
(tests/quant/make_autoquant_fixtures.py), they load in lamina to exactly the weights the tools' own dequantization
gives, with transformers' logits on those weights and the same greedy tokens through the engine."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lamina import LLM, SamplingParams
from lamina.quant.config import parse_quant_config, shard_names
from lamina.quant.packing import pack_int32, unpack_int32
from tests.helpers.hf_oracle import hf_greedy, load_hf
from tests.quant.helpers import PROMPTS as ALL_PROMPTS, hf_logits, lamina_logits, load

FIXTURES = Path(__file__).parent / "data" / "autoquant"
NAMES = ("gptq", "gptq_actorder", "awq")
VOCAB = 256  # the fixtures' vocabulary (make_autoquant_fixtures.py)
PROMPTS = {key: [t % VOCAB for t in ids] for key, ids in ALL_PROMPTS.items()}


def _lamina_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """Checkpoint linear name -> the weight lamina computes with, in the checkpoint's column order."""
    weights = {}
    for name, module in load(model_dir).named_modules():
        method = getattr(module, "quant_method", None)
        if method is None or not hasattr(method, "dequantized_weight"):
            continue
        full = method.dequantized_weight(module)
        perm = getattr(module, "input_perm", None)
        if perm is not None:  # act-order: lamina's columns are sorted by group
            full = full[:, torch.argsort(perm)]
        for shard, rows in zip(shard_names(name), full.split(method.output_sizes)):
            weights[f"{shard}.weight"] = rows
    return weights


def _reference_checkpoint(model_dir: Path, out: Path) -> Path:
    """The checkpoint with every packed linear replaced by the tool's dequantized weight (float32)."""
    out.mkdir()
    tensors = {k: v for k, v in load_file(str(model_dir / "model.safetensors")).items()
               if k.rpartition(".")[2] not in ("qweight", "qzeros", "scales", "g_idx")}
    save_file({**tensors, **load_file(str(model_dir / "reference.safetensors"))}, str(out / "model.safetensors"))
    config = json.loads((model_dir / "config.json").read_text())
    config.pop("quantization_config")
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_weights_equal_the_tools_dequantization(name):
    reference = load_file(str(FIXTURES / name / "reference.safetensors"))
    ours = _lamina_weights(FIXTURES / name)
    assert set(ours) == set(reference) and len(ours) == 14
    for key, weight in reference.items():
        torch.testing.assert_close(ours[key], weight, rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_logits_and_greedy_tokens_match_transformers(name, tmp_path):
    ref_dir = _reference_checkpoint(FIXTURES / name, tmp_path / "ref")
    ours, theirs = lamina_logits(FIXTURES / name, PROMPTS), hf_logits(ref_dir, PROMPTS)
    for key in theirs:
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-4, atol=1e-4)
    llm = LLM(model=str(FIXTURES / name), skip_tokenizer_init=True, block_size=4, num_kv_blocks=64,
              max_num_batched_tokens=5)
    prompts = list(PROMPTS.values())
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    hf = load_hf(str(ref_dir))
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(hf, p, 6) for p in prompts]
    llm.engine.check_integrity()


def test_act_order_permutes_the_input():
    model = load(FIXTURES / "gptq_actorder")
    assert model.model.layers[0].self_attn.qkv_proj.input_perm is not None
    assert load(FIXTURES / "gptq").model.layers[0].self_attn.qkv_proj.input_perm is None


def test_gptq_v2_stores_the_zero_itself(tmp_path):
    """checkpoint_format gptq_v2: the same weights with every stored zero point one higher."""
    out = shutil.copytree(FIXTURES / "gptq", tmp_path / "v2")
    tensors = load_file(str(out / "model.safetensors"))
    for key in [k for k in tensors if k.endswith("qzeros")]:
        zeros = unpack_int32(tensors[key], 4, tensors[key].shape[1] * 8, dim=1).to(torch.int16) + 1
        tensors[key] = pack_int32(zeros.to(torch.int8), 4, dim=1)
    save_file(tensors, str(out / "model.safetensors"))
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"]["checkpoint_format"] = "gptq_v2"
    (out / "config.json").write_text(json.dumps(config))
    reference = load_file(str(FIXTURES / "gptq" / "reference.safetensors"))
    ours = _lamina_weights(out)
    for key, weight in reference.items():
        torch.testing.assert_close(ours[key], weight, rtol=0, atol=0)


@pytest.mark.parametrize("raw, field", [
    ({"quant_method": "bitsandbytes"}, "quant_method: 'bitsandbytes'"),
    ({"quant_method": "gptq", "bits": 3}, "bits"),
    ({"quant_method": "gptq", "group_size": 0}, "group_size"),
    ({"quant_method": "gptq", "checkpoint_format": "marlin"}, "checkpoint_format: 'marlin'"),
    ({"quant_method": "gptq", "dynamic": {"-:.*down": {}}}, "dynamic"),
    ({"quant_method": "gptq", "desc_act": "yes"}, "desc_act"),
    ({"quant_method": "awq", "version": "gemv"}, "version: 'gemv'"),
    ({"quant_method": "awq", "bits": 8}, "bits"),
    ({"quant_method": "awq", "zero_point": False}, "zero_point"),
])
def test_bad_configs_name_the_field(raw, field):
    with pytest.raises(ValueError, match=f"quantization_config.{field}"):
        parse_quant_config(raw)


def test_awq_modules_to_not_convert_and_lm_head():
    from lamina.layers.embedding import ParallelLMHead
    from lamina.layers.linear import RowParallelLinear

    config = parse_quant_config({"quant_method": "awq", "w_bit": 4, "q_group_size": 64,
                                 "modules_to_not_convert": ["mlp"]})
    assert config.get_quant_method(RowParallelLinear, "model.layers.0.mlp.down_proj") is None
    assert config.get_quant_method(RowParallelLinear, "model.layers.0.self_attn.o_proj").args.group_size == 64
    assert config.get_quant_method(ParallelLMHead, "lm_head") is None
    gptq = parse_quant_config({"quant_method": "gptq", "lm_head": True, "group_size": -1})
    assert gptq.get_quant_method(ParallelLMHead, "lm_head").args.strategy == "channel"
