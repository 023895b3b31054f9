"""lamina.bench.fp8_gemm_sweep: the dry run (interpreter, tiny shapes) checks and times its candidates, and the
routing table it writes takes the kernel only where it beat the peer by MIN_GAIN."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("triton")

from lamina.bench import fp8_gemm_sweep  # noqa: E402
from lamina.kernels import fp8_gemm  # noqa: E402


def test_dry_run_checks_every_candidate(tmp_path) -> None:  # noqa: ANN001 - pytest fixture
    out = tmp_path / "sweep.json"
    assert fp8_gemm_sweep.main(["--dry-run", "--rows", "3", "--result-file", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [(r["shape"], r["m"]) for r in report["results"]] == [("a", 3), ("b", 3)]
    for r in report["results"]:
        assert r["failed"] == [] and all(c["ok"] for c in r["configs"]) and r["best_us"] > 0


def test_candidates_fill_the_batch_in_one_program_row() -> None:
    assert {c.block_m for c in fp8_gemm_sweep.candidates(1)} == {16}
    assert {c.block_m for c in fp8_gemm_sweep.candidates(33)} == {64}
    assert {c.block_m for c in fp8_gemm_sweep.candidates(256)} == {128}
    assert any(c.swap for c in fp8_gemm_sweep.candidates(16)) and any(c.num_warps == 8 for c in
                                                                     fp8_gemm_sweep.candidates(64))


def test_the_table_takes_the_kernel_only_where_it_won() -> None:
    cfg = fp8_gemm.Fp8GemmConfig(16, 64, 256, swap=True)
    results = [{"n": 64, "k": 32, "m": 1, "peer_us": 10.0, "best_us": 5.0, "best": vars(cfg)},
               {"n": 64, "k": 32, "m": 16, "peer_us": 10.0, "best_us": 9.9, "best": vars(cfg)},  # < MIN_GAIN
               {"n": 64, "k": 32, "m": 32, "peer_us": 10.0, "best_us": None, "best": None}]  # all failed
    entries = fp8_gemm_sweep.table_entries(results)
    assert entries == {"64x32": [[1, vars(cfg)], [16, None], [32, None]]}
    text = fp8_gemm_sweep._dumps({"dev": entries})
    assert json.loads(text) == {"dev": entries} and fp8_gemm.parse_table(entries)["64x32"][0] == (1, cfg)


def test_a_run_over_some_rows_keeps_the_other_buckets() -> None:
    old = {"64x32": [[1, {"a": 1}], [16, {"b": 2}], [64, None]], "8x8": [[1, None]]}
    new = {"64x32": [[16, None], [32, {"c": 3}]]}
    assert fp8_gemm_sweep.merge_entries(old, new) == {"64x32": [[1, {"a": 1}], [16, None], [32, {"c": 3}], [64, None]],
                                                      "8x8": [[1, None]]}
