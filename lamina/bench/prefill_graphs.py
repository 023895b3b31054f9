"""Time to first token at batch 1 with prompt chunks replayed in CUDA graphs and without them.

    python -m lamina.bench.prefill_graphs [--models demo,qwen3-0.6b,llama3-8b] [--prompt-lens 8,30,100,250,500]
                                          [--repeats 20] [--result-file out.json]

For each model (the shipped demo model, or a shape of lamina.bench.offline with dummy bf16 weights), two engines
one after the other: `cuda_graph_prefill_tokens=0` (every prompt chunk eager) and the default. Each times
`generate(max_tokens=1)` of one prompt of each length (the median of --repeats, after three warm-ups), with the
prefix cache off so that every call prefills the whole prompt. On the demo model both engines also generate 128
greedy tokens for each bench prompt (lamina.bench.spec's sets), all at once and one at a time, and the table says
how many outputs are identical. Prints a table, writes JSON.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from lamina import DEMO_MODEL, LLM, SamplingParams
from lamina.bench.offline import SHAPES, release_memory, write_config
from lamina.bench.spec import PROMPT_SETS
from lamina.config import EngineConfig, ModelConfig

DEFAULT_SLOTS = EngineConfig(ModelConfig(model=DEMO_MODEL)).cuda_graph_prefill_tokens
GREEDY = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)


def model_path(name: str, tmp: str) -> str:
    """The demo model's directory, or a config.json of shape `name` (dummy weights) written under `tmp`."""
    if name == "demo":
        return DEMO_MODEL
    directory = Path(tmp, name)
    directory.mkdir()
    return str(write_config(name, directory))


def engine(model: str, slots: int) -> LLM:
    dummy = model != DEMO_MODEL
    return LLM(model=model, load_format="dummy" if dummy else "auto", skip_tokenizer_init=dummy,
               enable_prefix_caching=False, gpu_memory_utilization=0.45, cuda_graph_prefill_tokens=slots)


def time_to_first_token(llm: LLM, prompt_len: int, repeats: int) -> float:
    """Median ms of generate(max_tokens=1) on one prompt of `prompt_len` token ids."""
    prompt = {"prompt_token_ids": [(7 * i + 3) % 1000 + 10 for i in range(prompt_len)]}
    params = SamplingParams(temperature=0, max_tokens=1)
    times = []
    for i in range(3 + repeats):
        start = time.perf_counter()
        llm.generate([prompt], params, use_tqdm=False)
        if i >= 3:
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def greedy_outputs(llm: LLM) -> tuple[list[list[int]], list[list[int]]]:
    """128 greedy tokens of every bench prompt: all at once, then one at a time."""
    prompts = [p for prompts in PROMPT_SETS.values() for p in prompts]
    together = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    alone = [llm.generate([p], GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    return together, alone


def measure(model: str, prompt_lens: list[int], repeats: int) -> dict:
    result: dict = {"ttft_ms": {}}
    outputs = {}
    for slots in (0, DEFAULT_SLOTS):
        llm = engine(model, slots)
        result["ttft_ms"][slots] = {n: time_to_first_token(llm, n, repeats) for n in prompt_lens}
        if model == DEMO_MODEL:
            outputs[slots] = greedy_outputs(llm)
        llm.engine.executor.shutdown()
        del llm
        release_memory()
    if outputs:
        (together0, alone0), (together1, alone1) = outputs[0], outputs[DEFAULT_SLOTS]
        result["greedy_identical"] = {"together": sum(a == b for a, b in zip(together0, together1)),
                                      "alone": sum(a == b for a, b in zip(alone0, alone1)), "of": len(alone0)}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="demo,qwen3-0.6b,llama3-8b",
                        help=f"comma-separated: demo, or shapes of lamina.bench.offline ({', '.join(SHAPES)})")
    parser.add_argument("--prompt-lens", default="8,30,100,250,500")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--result-file", default=None)
    args = parser.parse_args(argv)
    prompt_lens = [int(n) for n in args.prompt_lens.split(",")]
    report = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name() if torch.cuda.is_available()
              else "cpu", "torch": torch.__version__, "default_slots": DEFAULT_SLOTS, "models": {}}
    print(f"time to first token, batch 1, ms (median of {args.repeats}): eager prefill -> graphs "
          f"(cuda_graph_prefill_tokens=0 -> {DEFAULT_SLOTS})")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            result = report["models"][name] = measure(model_path(name, tmp), prompt_lens, args.repeats)
            eager, graphs = result["ttft_ms"][0], result["ttft_ms"][DEFAULT_SLOTS]
            cells = "  ".join(f"{n}: {eager[n]:.2f} -> {graphs[n]:.2f}" for n in prompt_lens)
            same = result.get("greedy_identical")
            tail = "" if same is None else (f"  greedy identical {same['together']}/{same['of']} together, "
                                            f"{same['alone']}/{same['of']} alone")
            print(f"  {name:12s} {cells}{tail}", flush=True)
    if args.result_file:
        Path(args.result_file).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
