"""The bounded fuzz run in CI (issue #10): 1,000 hypothesis-drawn requests (valid, near-valid, hostile,
malformed; 8 in flight; some abandoned by the client) against a real server on the tiny model, max_tokens <= 4.
No 5xx, no engine death, every 4xx an OpenAI error naming its field, gauges back to 0, no leaked KV block.
The long run (>= 10,000 cases, the demo model) is `python -m lamina.bench.fuzz` (docs/BENCHMARKS.md)."""
from __future__ import annotations

import json

from lamina.bench.fuzz import check_answer, run, summary
from lamina.bench.fuzz_cases import FuzzCase, FuzzTarget, generate_cases, to_json
from lamina.engine.async_engine import AsyncEngine
from lamina.server.settings import ServerSettings
from tests.server.harness import MODEL_NAME, make_engine

CASES = 1000


def test_cases_are_reproducible_and_hostile() -> None:
    target = FuzzTarget(MODEL_NAME, vocab_size=320, max_model_len=512)
    first, again = generate_cases(target, 200, seed=3), generate_cases(target, 200, seed=3)
    assert first == again and len(first) == 200
    assert {"valid", "mutated", "malformed"} <= {case.kind for case in first}
    assert to_json({"a": "\ud800", "b": [1.5, None]}) == '{"a":"\\ud800","b":[1.5,null]}'


def test_a_bounded_fuzz_run_finds_no_5xx_no_death_no_leak(model_dir: str) -> None:
    engine = AsyncEngine(make_engine(model_dir, max_model_len=512, num_kv_blocks=1024))
    settings = ServerSettings(served_model_name=MODEL_NAME, max_n=4, max_body_bytes=64 * 1024, max_queue=64)
    try:
        report = run(engine, settings, cases=CASES, seed=0, concurrency=8, max_tokens=4)
    finally:
        engine.shutdown()
    details = "\n".join(json.dumps(e)[:600] for e in report.server_errors[:5] + report.problems[:5])
    assert report.cases == CASES, summary(report)
    assert report.ok, summary(report) + "\n" + details
    assert report.by_status.get("200", 0) > CASES // 5 and report.by_status.get("400", 0) > CASES // 5


def test_the_checks_catch_what_they_should() -> None:
    case = FuzzCase("mutated", "POST", "/v1/completions", b"{}", field="temperature")
    named = json.dumps({"error": {"message": "m", "type": "t", "param": "temperature", "code": None}}).encode()
    wrong = json.dumps({"error": {"message": "m", "type": "t", "param": "top_p", "code": None}}).encode()
    assert check_answer(case, 400, named, "application/json") is None
    assert "instead of 'temperature'" in check_answer(case, 400, wrong, "application/json")
    assert "not an OpenAI error" in check_answer(case, 422, b'{"detail": []}', "application/json")
    assert "valid request got 400" in check_answer(FuzzCase("valid", "POST", "/v1/completions"), 400, named, "")
    assert "error event" in check_answer(case, 200, b'data: {"error": {}}\n\ndata: [DONE]\n\n', "text/event-stream")
    assert "[DONE]" in check_answer(case, 200, b'data: {"choices": []}\n\n', "text/event-stream")
