"""Strict weight loading: every tensor the model needs, nothing else, shapes checked; names in errors."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lamina.config import KernelChoice
from lamina.loader.hf_config import load_model_arch
from lamina.loader.model_loader import load_model
from lamina.loader.weights import iterate_weights, safetensors_files
from tests.helpers.tiny_models import make_tiny_model

CPU = torch.device("cpu")


def load(path: Path, **kwargs: object) -> torch.nn.Module:
    return load_model(str(path), load_model_arch(str(path)), torch.float32, CPU, **kwargs)


def rewrite(path: Path, edit: dict[str, torch.Tensor | None]) -> None:
    """Apply `edit` to the single-file checkpoint: a tensor replaces or adds, None deletes."""
    file = path / "model.safetensors"
    tensors = load_file(str(file))
    for name, tensor in edit.items():
        if tensor is None:
            del tensors[name]
        else:
            tensors[name] = tensor
    save_file(tensors, str(file), metadata={"format": "pt"})


@pytest.fixture()
def llama(tmp_path: Path) -> Path:
    return make_tiny_model("llama", tmp_path / "llama")


def test_missing_tensor_is_named(llama: Path) -> None:
    rewrite(llama, {"model.layers.1.self_attn.k_proj.weight": None, "lm_head.weight": None})
    with pytest.raises(ValueError, match=r"missing 2 tensor\(s\).*lm_head\.weight, "
                                         r"model\.layers\.1\.self_attn\.k_proj\.weight"):
        load(llama)


def test_unexpected_tensor_is_named(llama: Path) -> None:
    rewrite(llama, {"model.layers.0.mlp.extra.weight": torch.zeros(2), "model.layers.7.mlp.up_proj.weight":
                    torch.zeros(2)})
    with pytest.raises(ValueError, match=r"2 tensor\(s\) this LlamaForCausalLM does not expect: "
                                         r"model\.layers\.0\.mlp\.extra\.weight, model\.layers\.7"):
        load(llama)


def test_shape_mismatch_is_named(llama: Path) -> None:
    rewrite(llama, {"model.layers.0.self_attn.v_proj.weight": torch.zeros(16, 64)})
    with pytest.raises(ValueError, match=r"'model\.layers\.0\.self_attn\.v_proj\.weight'.*shape \(16, 64\).*"
                                         r"expects \(32, 64\)"):
        load(llama)


def test_tied_checkpoint_may_carry_lm_head_and_inv_freq(tmp_path: Path) -> None:
    path = make_tiny_model("qwen3", tmp_path / "tied", tie_word_embeddings=True)
    assert "lm_head.weight" not in load_file(str(path / "model.safetensors"))
    rewrite(path, {"lm_head.weight": torch.full((256, 64), 7.0),
                   "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)})
    model = load(path)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert not torch.all(model.lm_head.weight == 7.0)  # the copy is ignored, as HF does


def test_no_safetensors_mentions_pickle_refusal(llama: Path) -> None:
    (llama / "model.safetensors").rename(llama / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"no \*\.safetensors.*pytorch_model\.bin.*not loaded, on purpose"):
        load(llama)


def test_index_with_missing_shard(tmp_path: Path) -> None:
    path = make_tiny_model("llama", tmp_path / "sharded", max_shard_size="40KB")
    shards = sorted(path.glob("model-*.safetensors"))
    assert len(shards) > 2
    shards[1].unlink()
    with pytest.raises(ValueError, match=f"missing: {shards[1].name}"):
        safetensors_files(str(path))


def test_iterate_weights_streams_every_shard(tmp_path: Path) -> None:
    single = dict(iterate_weights(str(make_tiny_model("qwen2", tmp_path / "one"))))
    sharded = dict(iterate_weights(str(make_tiny_model("qwen2", tmp_path / "many", max_shard_size="40KB"))))
    assert single.keys() == sharded.keys() and "model.layers.1.self_attn.q_proj.bias" in single
    for name in single:
        torch.testing.assert_close(single[name], sharded[name], atol=0, rtol=0)


def test_bad_arguments(llama: Path) -> None:
    with pytest.raises(ValueError, match="load_format must be one of \\['auto', 'dummy'\\]"):
        load(llama, load_format="pt")
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        load(llama, attention_backend="flash")
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_model(str(llama), load_model_arch(str(llama)), torch.int8, CPU)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])  # qwen3: the per-head q/k norms too
def test_kernel_choice_reaches_every_layer(tmp_path: Path, kind: str) -> None:
    """load_model(kernels=...) is the model's one kernel choice: every layer that dispatches holds it."""
    off = KernelChoice(fused_ops=False, gemv=False)
    model = load(make_tiny_model(kind, tmp_path / kind), kernels=off)
    holders = [m for m in model.modules() if hasattr(m, "kernels")]
    kinds = {type(m).__name__ for m in holders}
    assert {"RMSNorm", "RotaryEmbedding", "SiluAndMul", "QKVParallelLinear", "RowParallelLinear",
            "MergedColumnParallelLinear", "ParallelLMHead", "DecoderAttention"} <= kinds
    assert all(m.kernels is off for m in holders)
    assert all(m.kernels == KernelChoice() for m in load(tmp_path / kind).modules() if hasattr(m, "kernels"))
