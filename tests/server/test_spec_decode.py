"""`lamina serve` with speculative decoding: greedy answers equal the offline API without it, and the
spec-decode counters reach /metrics."""
from __future__ import annotations

import openai

from lamina import LLM, SamplingParams
from tests.server.harness import MODEL_NAME, make_engine, scrape, start_server

PROMPTS = ["a = [1, 2, 3, 1, 2, 3, 1, 2", "def f(x): return x\ndef f(x): return", "for i in range(3):"]


def test_served_speculation_is_exact_and_counted(model_dir: str, offline: LLM) -> None:
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    expected = [o.outputs[0].text for o in offline.generate(PROMPTS, params, use_tqdm=False)]
    running = start_server(make_engine(model_dir, speculative_config={"num_speculative_tokens": 3, "adaptive": False}))
    try:
        with openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=30) as client:
            got = [client.completions.create(model=MODEL_NAME, prompt=p, max_tokens=24, temperature=0,
                                             extra_body={"ignore_eos": True}).choices[0].text for p in PROMPTS]
        assert got == expected
        metrics = scrape(running.url)
        drafts = metrics["lamina:spec_decode_num_draft_tokens_total"]
        accepted = metrics["lamina:spec_decode_num_accepted_tokens_total"]
        assert drafts > accepted > 0 and metrics["lamina:spec_decode_num_drafts_total"] > 0
        per_pos = [v for k, v in metrics.items() if k.startswith("lamina:spec_decode_num_accepted_tokens_per_pos")]
        assert per_pos and sum(per_pos) == accepted
        running.engine.check_integrity()
    finally:
        running.stop()
