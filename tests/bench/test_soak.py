"""`python -m lamina.bench.soak`, bounded: 15 s against a real `lamina serve` on the demo model, plus the
response checks and the RSS trend on made-up data."""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

from lamina.bench.soak import main
from lamina.bench.soak_load import LoadConfig, Plan, _check_events, _check_final, plan
from lamina.bench.soak_stats import Sample, rss_bytes, rss_trend

MB = 1 << 20


def test_a_bounded_soak_leaves_nothing_behind(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    code = main(["--duration", "15", "--concurrency", "6", "--sample-every", "1", "--num-kv-blocks", "40",
                 "--max-num-seqs", "8", "--result-file", str(out)])
    result = json.loads(out.read_text())
    assert result["requests"] > 20 and result["completed"] > 10 and result["cancelled"] > 0
    assert result["errors"] == {} and result["health"] == 200 and result["leaked_blocks"] == 0
    assert result["running"] == result["waiting"] == 0 and result["preemptions"] > 0
    assert result["server_exit_code"] == 0
    # 15 s is too short for the 5% bound to be meaningful (allocator warm-up); 20% still catches a leak.
    assert result["rss"]["growth_after_warmup"] < 0.2
    assert code == (1 if result["failures"] else 0)


def test_the_request_mix() -> None:
    rng, config = random.Random(0), LoadConfig("http://x", "m", 1.0, cancel_fraction=0.2)
    plans = [plan(rng, config) for _ in range(2000)]
    cancelled = sum(p.cancel is not None for p in plans) / len(plans)
    assert 0.17 < cancelled < 0.23
    assert {p.path for p in plans} == {"/v1/completions", "/v1/chat/completions"}
    assert {p.body["stream"] for p in plans} == {True, False} and {p.n for p in plans} == {1, 2, 3}
    assert all(p.cancel != "mid_stream" or p.body["stream"] for p in plans)


def test_responses_are_checked() -> None:
    p = Plan("/v1/completions", {"prompt": "x", "max_tokens": 4, "n": 2, "stream": True}, None, 0)
    done = [json.dumps({"choices": [{"index": i, "text": "a", "finish_reason": "length"}]}) for i in (0, 1)]
    assert _check_events(p, [*done, "[DONE]"]) is None
    assert _check_events(p, done)[0] == "malformed"  # no [DONE]
    assert _check_events(p, [done[0], "[DONE]"])[0] == "malformed"  # choice 1 never finished
    assert _check_events(p, ['{"error": {"message": "boom"}}', "[DONE]"])[0] == "stream_error"
    final = {"choices": [{"index": i, "text": "ab", "finish_reason": "stop"} for i in (0, 1)],
             "usage": {"completion_tokens": 5}}
    assert _check_final(p, final) is None
    assert "usage" in _check_final(p, {**final, "usage": {"completion_tokens": 9}})  # over n * max_tokens
    assert "choices" in _check_final(p, {**final, "choices": final["choices"][:1]})


def test_rss_trend() -> None:
    samples = [Sample(t, rss * MB, {}) for t, rss in ((0, 100), (10, 150), (20, 151), (30, 153), (40, 152))]
    trend = rss_trend(samples, warmup_s=10)
    assert (trend["start"], trend["warm"], trend["end"], trend["max_after_warmup"]) == (
        100 * MB, 150 * MB, 152 * MB, 153 * MB)
    assert trend["growth_after_warmup"] == 0.02 and trend["slope_mb_per_min"] > 0
    assert rss_bytes(os.getpid()) > MB
