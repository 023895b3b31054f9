"""GPU smoke test of the whole engine on the demo model: torch vs triton backends, greedy equality,
and a first offline-throughput figure. Prints a short table; JSON to $OUT/gpu_smoke.json if set.

    python scripts/gpu_smoke.py
"""
from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lamina import DEMO_MODEL, LLM, SamplingParams  # noqa: E402


def run(backend: str, prompts: list[dict], new_tokens: int) -> tuple[list[list[int]], float]:
    llm = LLM(model=DEMO_MODEL, device="cuda", attention_backend=backend, kv_cache_memory_bytes=8 << 30,
              max_num_batched_tokens=8192, max_num_seqs=256)
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    llm.engine.check_integrity()
    return [o.outputs[0].token_ids for o in outs], elapsed


def main() -> None:
    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(5, 8192) for _ in range(rng.randint(16, 512))]}
               for _ in range(128)]
    new_tokens = 128
    result = {}
    for backend in ("torch", "triton"):
        tokens, elapsed = run(backend, prompts, new_tokens)
        result[backend] = {"seconds": elapsed, "tok_s": len(prompts) * new_tokens / elapsed, "tokens": tokens}
    same = sum(a == b for a, b in zip(result["torch"]["tokens"], result["triton"]["tokens"]))
    print(f"{'backend':>8} {'tok/s':>9}\n" + "\n".join(
        f"{b:>8} {result[b]['tok_s']:>9.0f}" for b in ("torch", "triton")))
    print(f"greedy outputs identical (bf16, torch vs triton): {same}/{len(prompts)}")
    if os.environ.get("OUT"):
        summary = {b: {k: v for k, v in result[b].items() if k != "tokens"} for b in result}
        summary["identical"] = same
        Path(os.environ["OUT"], "gpu_smoke.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
