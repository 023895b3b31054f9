"""lamina.bench.w8a8_speed on CPU (--tiny): the schemes' configs, the dummy fp8 / int8 weights it relies on, and
one whole run (every scheme through prefill and W1, the table and its bars)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from lamina import LLM
from lamina.bench import w8a8_speed
from lamina.quant.config import parse_quant_config
from lamina.quant.fp8 import Fp8LinearMethod
from lamina.quant.w8a8_int8 import W8A8Int8LinearMethod


def test_scheme_configs_quantize_every_linear_but_the_lm_head(tmp_path: Path) -> None:
    for scheme, method in (("fp8", Fp8LinearMethod), ("w8a8", W8A8Int8LinearMethod)):
        (tmp_path / scheme).mkdir()
        path = w8a8_speed.scheme_config("tiny", tmp_path / scheme, scheme)
        config = parse_quant_config(json.loads(path.read_text())["quantization_config"])
        assert config.ignore == ("lm_head",) and config.schemes[0].input_activations is not None
        llm = LLM(model=str(path), load_format="dummy", skip_tokenizer_init=True, device="cpu", dtype="float32",
                  num_kv_blocks=16)
        modules = llm.engine.executor.worker.model.modules()
        layers = [m for m in modules if isinstance(getattr(m, "quant_method", None), method)]
        assert len(layers) == 2 * 4
        for layer in layers:  # valid values, positive scales, dequantized std ~ 0.02 as bf16's dummy weights
            assert (layer.weight_scale > 0).all() and torch.isfinite(layer.weight.float()).all()
            assert 0.01 < layer.quant_method.dequantized_weight(layer).std().item() < 0.04
    assert "quantization_config" not in json.loads(w8a8_speed.scheme_config("tiny", tmp_path, "bf16").read_text())


def test_a_tiny_run_measures_every_scheme(tmp_path: Path) -> None:
    out = tmp_path / "w8a8.json"
    assert w8a8_speed.main(["--tiny", "--result-file", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [r["scheme"] for r in report["schemes"]] == list(w8a8_speed.SCHEMES)
    for row in report["schemes"]:
        assert row["prefill"]["prompt_tokens"] == 2 * 64 and row["prefill"]["tok_per_s"] > 0
        assert row["w1"]["requests"] == 4 and row["w1"]["output_tokens"] == sum(w8a8_speed.w1_requests(4, 24)[1])
    text = w8a8_speed.table(report)
    assert "bar: fp8 prefill >= 1.3x" in text and "bar: fp8 w1 >= 1.15x" in text
