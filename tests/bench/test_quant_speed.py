"""lamina.bench.quant_speed on CPU: the tiny engine comparison in-process (reference path, no triton), the kernel
part in a subprocess under the interpreter, and the dummy quantized weights the engine part relies on."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lamina import LLM
from lamina.bench import quant_speed
from lamina.quant.config import parse_quant_config
from lamina.quant.packing import unpack_int32


def test_quantized_config_targets_every_linear_and_the_lm_head(tmp_path: Path) -> None:
    for scheme, bits in (("int4", 4), ("int8", 8)):
        (tmp_path / scheme).mkdir()
        path = quant_speed.quantized_config("llama3-8b", tmp_path / scheme, scheme)
        config = parse_quant_config(json.loads(path.read_text())["quantization_config"])
        assert config.ignore == () and config.schemes[0].weights.num_bits == bits
        assert config.scheme_for("Linear", ["lm_head"]) is not None
    assert "quantization_config" not in json.loads(quant_speed.quantized_config("tiny", tmp_path, None).read_text())


def test_dummy_quantized_weights_are_valid(tmp_path: Path) -> None:
    """Random words (every value), zero points in range, positive scales, dequantized std ~ 0.02, the shapes."""
    path = quant_speed.quantized_config("tiny", tmp_path, "int4", group_size=32)
    llm = LLM(model=str(path), load_format="dummy", skip_tokenizer_init=True, device="cpu", dtype="float32",
              num_kv_blocks=16)
    model = llm.engine.executor.worker.model
    layers = [m for m in model.modules() if hasattr(m, "weight_packed")]
    assert len(layers) == 2 * 4  # qkv, o, gate_up, down per layer (the tiny model ties its LM head)
    for layer in layers:
        method = layer.quant_method
        q = unpack_int32(layer.weight_packed, 4, method.input_size)
        assert set(q.unique().tolist()) == set(range(-8, 8))
        z = layer.weight_zero_point
        assert z.min() >= -8 and z.max() <= 7 and z.unique().numel() > 8
        assert (layer.weight_scale > 0).all()
        assert 0.01 < method.dequantized_weight(layer).std().item() < 0.04
        assert layer.weight_shape.tolist() == [[n, method.input_size] for n in method.output_sizes]


def test_engine_decode_tiny(tmp_path: Path) -> None:
    args = quant_speed.parse_args(["--tiny", "--new-tokens", "4"])
    results = [quant_speed.engine_decode(scheme, args, tmp_path) for scheme in (None, "int4", "int8")]
    assert [r["scheme"] for r in results] == ["bf16", "int4", "int8"]
    assert all(r["tokens"] == 4 and r["tok_per_s"] > 0 and r["batch_tok_per_s"] > 0 for r in results)
    assert all(r["batch"] == quant_speed.BATCH for r in results)
    bf16, int4, int8 = (r["weight_gb"] for r in results)
    assert int4 < int8 < bf16
    text = quant_speed.table({"kernels": [], "engine": results})
    assert "int4 weights" in text and "PASS" in text and f"batch {quant_speed.BATCH}" in text  # far below 5.5 GB


def test_kernel_part_runs_under_the_interpreter(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    done = subprocess.run([sys.executable, "-m", "lamina.bench.quant_speed", "--tiny", "--skip-engine"],
                          capture_output=True, text=True, timeout=900, env={**os.environ, "OUT": str(tmp_path)},
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "quant_speed.json").read_text())
    (row,) = report["kernels"]
    assert set(row["rows"]) == {"1", "3", "8"}
    assert all(r["int4_ok"] and r["int8_ok"] for r in row["rows"].values())
    assert row["gemm"]["9"]["ok"] and row["int4_configs"]["best"] is not None
    assert "int4 wna16_gemv default" in done.stdout
    # the kernel the engine runs at each row count (lamina.quant.wna16._takes_tc)
    kernels = {m: (r["int4_kernel"], r["int8_kernel"]) for m, r in row["rows"].items()}
    assert kernels == {"1": ("wna16_row_gemv", "wna16_row_gemv"), "3": ("wna16_tc_gemv", "wna16_row_gemv"),
                       "8": ("wna16_tc_gemv", "wna16_tc_gemv")}
    assert all(row["rows"][m]["gemv_bf16_us"] > 0 for m in ("1", "3", "8"))  # lamina's bf16 GEMV: up to 8 rows
    assert torch.isfinite(torch.tensor(row["rows"]["1"]["int4_us"]))
