"""`lamina.bench.offline --dry-run`: W1 and W2 on a tiny dummy-weight shape on CPU, with the HF peer for W2."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from lamina.bench import quant_speed
from lamina.bench.offline import (SHAPES, W1_EXPECTED_OUTPUT_TOKENS, main, make_llm, parse_args, w1_requests,
                                   write_config)
from lamina.layers.dispatch import KernelChoice
from lamina.loader.hf_config import load_model_arch


def test_w1_requests_match_the_published_workload() -> None:
    prompts, outputs = w1_requests()
    assert len(prompts) == 256 and sum(outputs) == W1_EXPECTED_OUTPUT_TOKENS
    assert min(map(len, prompts)) >= 100 and max(map(len, prompts)) <= 1024
    assert max(max(p) for p in prompts) <= 10000


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_shape_configs_parse(tmp_path: Path, shape: str) -> None:
    arch = load_model_arch(str(write_config(shape, tmp_path)))
    assert arch.architecture == SHAPES[shape]["architectures"][0] and arch.eos_token_ids == ()
    if shape == "llama3-8b":
        assert arch.rope_scaling["rope_type"] == "llama3" and arch.head_dim == 128


def test_w1_dry_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    result = tmp_path / "w1.json"
    assert main(["--workload", "w1", "--dry-run", "--result-file", str(result)]) == 0
    report = json.loads(result.read_text())
    _, outputs = w1_requests(8, 40)
    assert report["workload"] == "w1" and report["hardware"] == "cpu" and "--dry-run" in report["command"]
    assert report["lamina"]["output_tokens"] == sum(outputs) and report["lamina"]["tok_per_s"] > 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3].startswith("lamina |") and lines[-1].startswith("steps: prefill: ")
    steps = report["lamina"]["steps"]
    assert steps["prefill"]["steps"] > 0 and steps["decode ahead"]["steps"] > 0  # async scheduling ran ahead


def test_w2_dry_run_with_hf_peer(tmp_path: Path) -> None:
    result = tmp_path / "w2.json"
    assert main(["--workload", "w2", "--dry-run", "--peer", "hf", "--also-eager", "--result-file",
                 str(result)]) == 0
    report = json.loads(result.read_text())
    lamina = report["lamina"]
    assert lamina["decode_tok_per_s"] > 0 and 0 < lamina["ceiling_frac"] < 1
    assert lamina["startup_to_first_token_s"] >= lamina["startup_s"] > 0
    assert lamina["cuda_graphs"] is False and report["lamina_eager"]["enforce_eager"] is True
    assert report["peer"]["name"].startswith("hf transformers") and report["peer"]["decode_tok_per_s"] > 0


@pytest.mark.parametrize("flags,pdl", [([], True), (["--no-enable-pdl"], False)])
def test_no_enable_pdl_reaches_the_engine(tmp_path: Path, flags: list[str], pdl: bool) -> None:
    """`--no-enable-pdl` (offline, and so w1_sweep; quant_speed) is the engine argument enable_pdl=False: the model's
    layers are built with KernelChoice(pdl=False), as the same tree A/B-compares PDL."""
    args = parse_args(["--workload", "w2", "--dry-run", *flags])
    assert quant_speed.parse_args(["--tiny", *flags]).enable_pdl is pdl
    llm = make_llm(write_config(args.shape, tmp_path), args)
    model = llm.engine.executor.worker.model
    choices = {m.kernels.pdl for m in model.modules() if isinstance(getattr(m, "kernels", None), KernelChoice)}
    assert choices == {pdl}
    llm.engine.check_integrity()
