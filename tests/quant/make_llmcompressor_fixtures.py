"""Regenerate tests/quant/data/llmcompressor/*: tiny Llama checkpoints quantized by llm-compressor itself
(W4A16 GPTQ and RTN, W8A16, W8A8 int8 with SmoothQuant, FP8_DYNAMIC).

They are committed so that the loader tests run without llm-compressor (a heavy install that pins its own
compressed-tensors); test_llmcompressor.py checks them against transformers + compressed-tensors, and
re-runs this script when llmcompressor imports. Run from the repository root:

    pip install llmcompressor==0.14.0.1   # in a separate environment is fine
    python tests/quant/make_llmcompressor_fixtures.py [OUT_DIR]
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.helpers.tiny_tokenizer import save_tiny_tokenizer  # noqa: E402

OUT = Path(__file__).parent / "data" / "llmcompressor"
VOCAB = 300
# name -> (modifier, scheme, ignore, tie_word_embeddings)
FIXTURES = {
    "gptq_w4a16": ("gptq", "W4A16", ["lm_head"], True),  # symmetric int4, group 128, actorder static
    "rtn_w4a16_asym": ("rtn", "W4A16_ASYM", ["lm_head"], True),  # asymmetric int4 with zero points
    "rtn_w8a16_lm_head": ("rtn", "W8A16", [], False),  # int8, group 128, the LM head quantized too
    "smoothquant_w8a8": ("smoothquant", "W8A8", ["lm_head"], True),  # int-quantized, norms smoothed (α 0.5)
    "fp8_dynamic": ("rtn", "FP8_DYNAMIC", ["lm_head"], False),  # float-quantized, per-token fp8 activations
}


def _base(path: Path, tie: bool) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                         initializer_range=0.2, tie_word_embeddings=tie, bos_token_id=None, eos_token_id=0)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(str(path))
    save_tiny_tokenizer(path, VOCAB)


def _calibration(tokenizer: object) -> object:
    from datasets import Dataset

    ids = torch.randint(0, VOCAB, (16, 32), generator=torch.Generator().manual_seed(1)).tolist()
    return Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * 32] * 16})


def make(name: str, out: Path, work: Path) -> Path:
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    from llmcompressor.modifiers.transform import SmoothQuantModifier
    from transformers import AutoTokenizer, LlamaForCausalLM

    kind, scheme, ignore, tie = FIXTURES[name]
    base = work / f"{name}-base"
    _base(base, tie)
    model = LlamaForCausalLM.from_pretrained(str(base))
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    if kind == "gptq":
        oneshot(model=model, processor=tokenizer, dataset=_calibration(tokenizer), num_calibration_samples=16,
                max_seq_length=32, recipe=GPTQModifier(targets="Linear", scheme=scheme, ignore=ignore))
    elif kind == "smoothquant":  # llm-compressor's W8A8 example: SmoothQuant, then round to nearest
        recipe = [SmoothQuantModifier(smoothing_strength=0.5),
                  QuantizationModifier(targets="Linear", scheme=scheme, ignore=ignore)]
        oneshot(model=model, processor=tokenizer, dataset=_calibration(tokenizer), num_calibration_samples=16,
                max_seq_length=32, recipe=recipe)
    else:
        oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme=scheme, ignore=ignore))
    target = out / name
    model.save_pretrained(str(target), save_compressed=True)
    tokenizer.save_pretrained(str(target))
    (target / "recipe.yaml").unlink(missing_ok=True)
    return target


if __name__ == "__main__":
    import tempfile

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    with tempfile.TemporaryDirectory() as work:
        for fixture in FIXTURES:
            print(make(fixture, out, Path(work)))
