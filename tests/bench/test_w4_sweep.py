"""W4 sweep: the dry run end to end (real `lamina serve` subprocesses without a tokenizer), and the streaming
that makes its latencies honest: without a tokenizer, one chunk per step carrying token ids."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from lamina.bench import w4_sweep
from lamina.bench.datasets import SampleRequest
from lamina.bench.offline import write_config
from lamina.bench.serve import ClientConfig, Connector, stream_completion
from tests.server.harness import RunningServer, make_engine, start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    config = write_config("tiny", tmp_path_factory.mktemp("w4-tiny"))
    running = start_server(make_engine(str(config), load_format="dummy", skip_tokenizer_init=True))
    yield running
    running.stop()


def _body(server: RunningServer, max_tokens: int) -> dict:
    return {"model": server.settings.served_model_name, "prompt": [1, 2, 3, 4, 5], "max_tokens": max_tokens,
            "stream": True, "ignore_eos": True, "temperature": 0.6}


def test_without_a_tokenizer_each_step_streams_its_token_ids(server: RunningServer) -> None:
    chunks = []
    with httpx.stream("POST", server.base_url + "/completions", json=_body(server, 8), timeout=30) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:])["choices"][0])
    assert len(chunks) == 8  # one per decode step, not one at the end
    assert all(c["text"] == "" and len(c["token_ids"]) == 1 for c in chunks)
    assert [c["finish_reason"] for c in chunks] == [None] * 7 + ["length"]


def test_the_bench_client_times_every_token_without_a_tokenizer(server: RunningServer) -> None:
    cfg = ClientConfig(api_url=server.base_url + "/completions", model=server.settings.served_model_name,
                       ignore_eos=True, temperature=0.6)
    record = asyncio.run(stream_completion(Connector(cfg), cfg, SampleRequest([1, 2, 3, 4, 5], 5, 8)))
    assert record.success, record.error
    assert record.output_tokens == 8 and len(record.itl) == 7  # the last token (with the finish) counted too
    assert record.latency > record.ttft > 0


def test_grid_settings_parse() -> None:
    assert w4_sweep.Setting.parse("defaults") == w4_sweep.Setting()
    assert w4_sweep.Setting.parse("256x8192").label == "256 / 8192"
    with pytest.raises(ValueError, match="SEQSxTOKENS"):
        w4_sweep.Setting.parse("256/8192")


def test_dry_run_serves_every_setting_at_every_rate(tmp_path, capsys) -> None:
    result = tmp_path / "w4.json"
    assert w4_sweep.main(["--dry-run", "--disable-tqdm", "--result-file", str(result)]) == 0
    rows = json.loads(result.read_text())["rows"]
    assert [r["label"] for r in rows] == ["defaults", "4 / 64"]
    assert (rows[1]["effective_max_num_seqs"], rows[1]["effective_max_num_batched_tokens"]) == (4, 64)
    assert rows[0]["effective_max_num_seqs"] is not None  # read from the server's start-up log
    for row in rows:
        assert row["error"] is None
        assert [p["request_rate"] for p in row["points"]] == [16.0, "inf"]
        for point in row["points"]:
            assert point["completed"] == 6 and point["failed"] == 0
            assert point["mean_ttft_ms"] > 0 and point["mean_itl_ms"] > 0 and point["output_throughput"] > 0
    table = capsys.readouterr().out.split("W4 sweep | ")[-1]
    assert table.startswith("config (effective) | rate") and "4 / 64 (4 / 64) | inf | 6/6 |" in table
