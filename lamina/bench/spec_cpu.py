"""Speculative decoding on CPU: the demo model at batch 1, n-gram drafts against none, in one process (issue #12).

    python -m lamina.bench.spec_cpu [--model DIR] [--new-tokens 128] [--k 3] [--result-file out.json]

Three prompt sets kept apart (acceptance depends on the language and the task): Python code to complete, chat
turns, English prose. Each prompt runs alone (batch 1), greedy and at temperature 0.6, first without
speculation and then with it, on two engines built once. A progress bar counts every generated token; at the end
it prints a table (tok/s off and on, speed-up, acceptance rate, mean tokens per verify step) and writes JSON.
"""
from __future__ import annotations

import sys
import time


from lamina import LLM, SamplingParams
from lamina.bench.cpu_report import cpu_bench_parser, run_info, write_report

PROMPT_SETS = {
    "code": ["def fibonacci(n):\n", "class Stack:\n    def __init__(self):\n", "def binary_search(xs, target):\n",
             "import os\nimport sys\n\n\ndef main(argv):\n", "def parse_args():\n    parser = argparse.ArgumentParser(",
             "def merge_sort(items):\n", "with open(path) as f:\n    for line in f:\n",
             "@dataclass\nclass Point:\n    x: float\n"],
    "chat": ["User: How do I reverse a list in Python?\nAssistant:", "User: What is a hash map?\nAssistant:",
             "User: Write a haiku about rain.\nAssistant:", "User: Explain recursion simply.\nAssistant:",
             "User: How do I read a file line by line?\nAssistant:", "User: What does HTTP 404 mean?\nAssistant:",
             "User: Give me three tips for writing tests.\nAssistant:", "User: What is a closure?\nAssistant:"],
    "prose": ["The history of the printing press", "Once upon a time, in a small village by the sea,",
              "Photosynthesis is the process by which", "The city woke slowly that morning, and",
              "In economics, inflation refers to", "The old lighthouse keeper had kept a diary for",
              "Mountains form when tectonic plates", "She opened the letter and read the first line:"],
}
TEMPERATURES = (0.0, 0.6)


def generate_alone(llm: LLM, prompts: list[str], params: SamplingParams, bar) -> tuple[int, float]:  # noqa: ANN001
    """(tokens, seconds) over the prompts run one at a time."""
    tokens, seconds = 0, 0.0
    for prompt in prompts:
        start = time.perf_counter()
        out = llm.generate([prompt], params, use_tqdm=False)[0]
        seconds += time.perf_counter() - start
        tokens += len(out.outputs[0].token_ids)
        bar.update(len(out.outputs[0].token_ids))
    return tokens, seconds


def run(model_dir: str, new_tokens: int, k: int, disable_progress: bool = False) -> dict:
    from tqdm.auto import tqdm

    spec = {"method": "ngram", "num_speculative_tokens": k}
    engines = {"off": LLM(model=model_dir), "ngram": LLM(model=model_dir, speculative_config=spec)}
    total = 2 * len(TEMPERATURES) * sum(map(len, PROMPT_SETS.values())) * new_tokens
    bar = tqdm(total=total, desc="spec", unit="tok", disable=disable_progress)
    for llm in engines.values():  # warm-up
        llm.generate(["def f(x):"], SamplingParams(max_tokens=8), use_tqdm=False)
    rows = []
    for name, prompts in PROMPT_SETS.items():
        for temperature in TEMPERATURES:
            params = SamplingParams(temperature=temperature, max_tokens=new_tokens, ignore_eos=True, seed=0)
            row = {"prompts": name, "temperature": temperature}
            for label, llm in engines.items():
                bar.set_description(f"spec {name} T={temperature} {label}")
                before = llm.engine.get_stats().snapshot().spec
                tokens, seconds = generate_alone(llm, prompts, params, bar)
                after = llm.engine.get_stats().spec
                row[f"{label}_tok_s"] = tokens / seconds
                if label == "ngram":
                    drafted = after.num_draft_tokens - before.num_draft_tokens
                    accepted = after.num_accepted_tokens - before.num_accepted_tokens
                    steps = after.num_drafts - before.num_drafts
                    row.update(acceptance_rate=accepted / drafted if drafted else 0.0,
                               tokens_per_verify_step=1 + accepted / steps if steps else 0.0)
            row["speedup"] = row["ngram_tok_s"] / row["off_tok_s"]
            rows.append(row)
    bar.close()
    for llm in engines.values():
        llm.engine.check_integrity()
    return {"workload": "speculative decoding, batch 1, CPU", "model": model_dir, "new_tokens": new_tokens,
            "speculative_config": spec, **run_info(), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = cpu_bench_parser(__doc__)
    parser.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    args = parser.parse_args(argv)
    report = run(args.model, args.new_tokens, args.k, args.disable_tqdm)
    print("prompts  T    off tok/s  ngram tok/s  speed-up  acceptance  tokens/verify")
    for r in report["rows"]:
        print(f"{r['prompts']:7s} {r['temperature']:.1f} {r['off_tok_s']:10.1f} {r['ngram_tok_s']:12.1f} "
              f"{r['speedup']:8.2f}x {r['acceptance_rate']:11.2f} {r['tokens_per_verify_step']:14.2f}")
    write_report(args.result_file, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
