"""`lamina bench serve` / `lamina bench plot` end to end through `register()`: table, JSON, PNG, errors."""
from __future__ import annotations

import argparse
import json
import re

import pytest

from lamina.bench.cli import register
from tests.bench.stub_server import MODEL, StubConfig, StubServer

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="lamina")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_serve_sweep_writes_json_and_png(tmp_path, capsys):
    result, png = tmp_path / "r.json", tmp_path / "r.png"
    with StubServer(StubConfig(ttft_s=0.02, itl_s=0.005)) as stub:
        rc = _main(["bench", "serve", "--base-url", stub.base_url + "/v1", "--num-prompts", "6",
                    "--random-input-len", "16", "--random-output-len", "4", "--request-rate", "50", "inf",
                    "--goodput", "ttft:60000", "tpot:60000", "--ignore-eos", "--result-file", str(result),
                    "--plot", str(png), "--disable-tqdm", "--save-detailed"])
    assert rc == 0
    out = capsys.readouterr().out
    assert out.count("Serving Benchmark Result") == 2 and "Mean TPOT (ms):" in out and "good/s" in out
    data = json.loads(result.read_text())
    assert data["model"] == MODEL  # read from GET /v1/models
    assert data["goodput_slos_ms"] == {"ttft": 60000.0, "tpot": 60000.0}
    assert data["dataset"]["num_prompts"] == 6 and data["percentiles"] == [50.0, 90.0, 99.0]
    assert [p["request_rate"] for p in data["points"]] == [50.0, "inf"]
    for point in data["points"]:
        assert point["completed"] == 6 and point["failed"] == 0 and point["total_output_tokens"] == 24
        assert point["request_goodput"] == pytest.approx(point["request_throughput"])
        assert {"mean_ttft_ms", "p99_tpot_ms", "median_itl_ms", "p90_e2el_ms", "output_throughput"} <= point.keys()
        assert len(point["requests"]) == 6 and point["requests"][0]["output_tokens"] == 4
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_plot_command_overlays_results(tmp_path):
    paths = []
    for label, scale in (("lamina", 1.0), ("peer", 2.0)):
        points = [{"request_rate": r, "p50_ttft_ms": 10 * scale * i, "p99_ttft_ms": 20 * scale * i,
                   "median_tpot_ms": 5.0, "p99_tpot_ms": 9.0, "p50_itl_ms": 4.0, "p99_itl_ms": 8.0}
                  for i, r in enumerate([1.0, 2.0, 4.0, "inf"], 1)]
        path = tmp_path / f"{label}.json"
        path.write_text(json.dumps({"label": label, "points": points}))
        paths.append(str(path))
    out = tmp_path / "sub" / "plot.png"
    assert _main(["bench", "plot", *paths, "--out", str(out)]) == 0
    assert out.read_bytes().startswith(PNG_MAGIC)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="no 'points'"):
        _main(["bench", "plot", str(tmp_path / "bad.json"), "--out", str(out)])


def test_failures_are_reported_with_a_nonzero_exit(capsys):
    with StubServer(StubConfig(fail_every=1)) as stub:
        rc = _main(["bench", "serve", "--base-url", stub.base_url, "--model", MODEL, "--num-prompts", "3",
                    "--random-input-len", "8", "--random-output-len", "2", "--num-warmups", "0",
                    "--disable-tqdm"])
    captured = capsys.readouterr()
    assert rc == 1 and re.search(r"Failed requests: +3", captured.out)
    assert "HTTP 400" in captured.out and "every request failed" in captured.err


@pytest.mark.parametrize("argv, message", [
    (["--goodput", "foo:1"], "--goodput"), (["--metric-percentiles", "50,200"], "--metric-percentiles"),
    (["--extra-body", "[1]"], "--extra-body"), (["--random-range-ratio", "1.5"], "--random-range-ratio"),
    (["--plot", "x.png"], "--result-file"), (["--base-url", "localhost:1"], "--base-url"),
])
def test_bad_options_name_the_option(argv, message):
    with pytest.raises(ValueError, match=message):
        _main(["bench", "serve", "--model", "m", *argv])


def test_a_failed_warm_up_names_the_likely_cause(capsys):
    with StubServer(StubConfig(fail_every=1, fail_statuses=(400,))) as stub:
        with pytest.raises(ValueError) as info:
            _main(["bench", "serve", "--base-url", stub.base_url, "--num-prompts", "2", "--disable-tqdm"])
    assert "HTTP 400: stub failure 400" in str(info.value) and "rejected the request" in str(info.value)
    # the stub's /v1/models reports no limits (like HF `transformers serve`): nothing is fitted, and it says so
    assert "does not report max_model_len" in capsys.readouterr().err
    with StubServer() as stub:
        port = stub.base_url.rsplit(":", 1)[1]
    with pytest.raises(ValueError, match="no server answered: check --base-url"):
        _main(["bench", "serve", "--base-url", f"http://127.0.0.1:{port}", "--model", MODEL, "--num-prompts", "1",
               "--disable-tqdm"])
