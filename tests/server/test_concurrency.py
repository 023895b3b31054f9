"""36 concurrent requests (AsyncOpenAI, half of them streaming), twice, equal offline LLM.generate; /metrics after."""
from __future__ import annotations

import asyncio

import openai

from lamina import LLM, SamplingParams
from tests.server.harness import MODEL_NAME, RunningServer, scrape

WORDS = ["def", "class", "for", "The quick", "brown fox", "return a + b", "print(i)", "日本語", "🙂", "self.x"]
PROMPTS = [f"{WORDS[i % 10]} {WORDS[(i * 7) % 10]} {i}" for i in range(36)]
MAX_TOKENS = [4 + (i * 5) % 17 for i in range(36)]


async def one(client: openai.AsyncOpenAI, index: int) -> str:
    kwargs = dict(model=MODEL_NAME, prompt=PROMPTS[index], max_tokens=MAX_TOKENS[index], temperature=0,
                  extra_body={"ignore_eos": True})
    if index % 2:
        stream = await client.completions.create(stream=True, **kwargs)
        return "".join([chunk.choices[0].text async for chunk in stream])
    return (await client.completions.create(**kwargs)).choices[0].text


async def all_at_once(base_url: str) -> list[str]:
    async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60) as client:
        return await asyncio.gather(*(one(client, i) for i in range(len(PROMPTS))))


def test_concurrent_greedy_requests_equal_offline_generate(server: RunningServer, offline: LLM) -> None:
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in MAX_TOKENS]
    expected = [o.outputs[0].text for o in offline.generate(PROMPTS, params, use_tqdm=False)]
    # Twice: the second round's prompts are in the prefix cache whatever the first round's arrival order.
    for _ in range(2):
        assert asyncio.run(all_at_once(server.base_url)) == expected
        server.engine.check_integrity()

    metrics = scrape(server.url)
    tokenizer = offline.get_tokenizer()
    assert metrics['lamina:request_success_total{finished_reason="length"}'] == 2 * len(PROMPTS)
    assert metrics["lamina:prompt_tokens_total"] == 2 * sum(len(tokenizer.encode(p)) for p in PROMPTS)
    assert metrics["lamina:generation_tokens_total"] == 2 * sum(MAX_TOKENS)
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "time_per_output_token_seconds"):
        assert metrics[f"lamina:{name}_count"] == 2 * len(PROMPTS) and metrics[f"lamina:{name}_sum"] > 0
    assert metrics["lamina:e2e_request_latency_seconds_sum"] >= metrics["lamina:time_to_first_token_seconds_sum"]
    assert metrics["lamina:num_requests_running"] == metrics["lamina:num_requests_waiting"] == 0
    assert metrics["lamina:kv_cache_usage_perc"] == 0.0
    assert metrics["lamina:prefix_cache_queries_total"] >= metrics["lamina:prefix_cache_hits_total"] > 0
    assert 0 < metrics["lamina:prefix_cache_hit_rate"] <= 1 and metrics["lamina:num_preemptions_total"] == 0
