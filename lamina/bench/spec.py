"""Speculative decoding: each method against none, in one process, on CPU or GPU (issue #12).

    python -m lamina.bench.spec [--model DIR] [--methods ngram,draft_model,medusa,early_exit] [--k 3]
                                [--new-tokens 128] [--batch-sizes 1,8,32,128] [--result-file out.json]

Batch 1: three prompt sets kept apart (acceptance depends on the language and the task): Python code to
complete, chat turns, English prose. Each prompt runs alone, greedy and at temperature 0.6. Throughput: B
prompts (the sets' prompts in turn) submitted together at temperature 0.6, for each batch size B. Engines are
built one after the other (off first) with their default arguments, and each is shut down before the next.
A progress bar counts every generated token; at the end it prints the tables and writes JSON.
"""
from __future__ import annotations

import gc
import itertools
import sys
import time

import torch

from lamina import DEMO_DRAFT, LLM, SamplingParams
from lamina.bench.cpu_report import cpu_bench_parser, run_info, write_report
from lamina.engine.drafts import SpecDecodeStats

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
METHODS = ("ngram", "draft_model", "medusa", "early_exit")


def spec_config(method: str, k: int, draft_model: str, medusa_model: str | None) -> dict:
    models = {"draft_model": draft_model, "medusa": medusa_model}
    return {"method": method, "num_speculative_tokens": k, **({"model": models[method]} if method in models else {})}


def _counted(llm: LLM, run) -> tuple[int, float, SpecDecodeStats, SpecDecodeStats, dict]:  # noqa: ANN001
    """(tokens, seconds) of `run()`, the engine's spec counters before and after it, and its steps by kind."""
    before = llm.engine.get_stats().snapshot().spec
    llm.engine.step_log = []
    start = time.perf_counter()
    tokens = run()
    seconds = time.perf_counter() - start
    steps, llm.engine.step_log = llm.engine.step_log, None
    return tokens, seconds, before, llm.engine.get_stats().snapshot().spec, _step_fields(steps)


def _step_fields(steps: list) -> dict:
    """Mean wall time per step of each kind (prefill, decode, verify), in ms, and how many."""
    kinds: dict[str, list[float]] = {}
    for step in steps:
        kinds.setdefault(step.kind, []).append(step.seconds)
    return {"step_ms": {kind: 1000 * sum(s) / len(s) for kind, s in kinds.items()},
            "steps": {kind: len(s) for kind, s in kinds.items()}}


def _spec_fields(before: SpecDecodeStats, after: SpecDecodeStats) -> dict:
    drafted = after.num_draft_tokens - before.num_draft_tokens
    accepted = after.num_accepted_tokens - before.num_accepted_tokens
    steps = after.num_drafts - before.num_drafts
    return {"acceptance_rate": accepted / drafted if drafted else 0.0,
            "tokens_per_verify_step": 1 + accepted / steps if steps else 0.0}


def batch_one(llm: LLM, new_tokens: int, bar) -> list[dict]:  # noqa: ANN001
    """One row per prompt set and temperature: each prompt alone."""
    rows = []
    for name, prompts in PROMPT_SETS.items():
        for temperature in TEMPERATURES:
            params = SamplingParams(temperature=temperature, max_tokens=new_tokens, ignore_eos=True, seed=0)

            def run() -> int:
                outs = [llm.generate([p], params, use_tqdm=False)[0].outputs[0] for p in prompts]
                bar.update(sum(len(o.token_ids) for o in outs))
                return sum(len(o.token_ids) for o in outs)
            tokens, seconds, before, after, steps = _counted(llm, run)
            rows.append({"prompts": name, "temperature": temperature, "tok_s": tokens / seconds,
                         **_spec_fields(before, after), **steps})
    return rows


def throughput(llm: LLM, batch_sizes: list[int], new_tokens: int, bar) -> list[dict]:  # noqa: ANN001
    """One row per batch size: that many prompts at once, temperature 0.6."""
    everything = [p for prompts in PROMPT_SETS.values() for p in prompts]
    rows = []
    for size in batch_sizes:
        prompts = list(itertools.islice(itertools.cycle(everything), size))
        params = SamplingParams(temperature=0.6, max_tokens=new_tokens, ignore_eos=True)

        def run() -> int:
            outs = llm.generate(prompts, params, use_tqdm=False)
            bar.update(sum(len(o.outputs[0].token_ids) for o in outs))
            return sum(len(o.outputs[0].token_ids) for o in outs)
        tokens, seconds, before, after, steps = _counted(llm, run)
        rows.append({"batch_size": size, "tok_s": tokens / seconds, **_spec_fields(before, after), **steps})
    return rows


def _free_device_memory() -> None:
    """After the last reference to an engine is gone: its KV cache and graphs go back to the device."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run(model_dir: str, methods: list[str], k: int, new_tokens: int, batch_sizes: list[int], engine_args: dict,
        draft_model: str = DEMO_DRAFT, medusa_model: str | None = None, disable_progress: bool = False) -> dict:
    from tqdm.auto import tqdm

    labels = ["off", *methods]
    per_engine = (len(TEMPERATURES) * sum(map(len, PROMPT_SETS.values())) + sum(batch_sizes)) * new_tokens
    bar = tqdm(total=len(labels) * per_engine, desc="spec", unit="tok", disable=disable_progress)
    configs, results = {}, {}
    for label in labels:
        configs[label] = None if label == "off" else spec_config(label, k, draft_model, medusa_model)
        bar.set_description(f"spec {label}")
        llm = LLM(model=model_dir, speculative_config=configs[label], **engine_args)
        warm_up = [p for prompts in PROMPT_SETS.values() for p in prompts]  # every prompt length's kernels
        llm.generate(warm_up, SamplingParams(max_tokens=8), use_tqdm=False)
        results[label] = {"batch_one": batch_one(llm, new_tokens, bar),
                          "throughput": throughput(llm, batch_sizes, new_tokens, bar)}
        llm.engine.check_integrity()
        llm.engine.executor.shutdown()
        del llm
        _free_device_memory()
    bar.close()
    return {"workload": "speculative decoding: batch 1 per prompt set, and throughput by batch size",
            "model": model_dir, "new_tokens": new_tokens, "speculative_configs": configs,
            "engine_args": engine_args, "device": _device_name(), **run_info(), "results": results}


def _device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def print_tables(report: dict) -> None:
    results = report["results"]
    off = results["off"]
    print("batch 1: method  prompts  T    tok/s  speed-up  acceptance  tokens/verify  ms/step by kind")
    for label, result in results.items():
        for row, base in zip(result["batch_one"], off["batch_one"]):
            print(f"  {label:12s} {row['prompts']:6s} {row['temperature']:.1f} {row['tok_s']:9.1f} "
                  f"{row['tok_s'] / base['tok_s']:8.2f}x {row['acceptance_rate']:11.2f} "
                  f"{row['tokens_per_verify_step']:14.2f}  {_kinds(row)}")
    print("throughput: method  batch  tok/s  vs off  acceptance  ms/step by kind")
    for label, result in results.items():
        for row, base in zip(result["throughput"], off["throughput"]):
            print(f"  {label:12s} {row['batch_size']:5d} {row['tok_s']:10.1f} {row['tok_s'] / base['tok_s']:7.2f}x "
                  f"{row['acceptance_rate']:11.2f}  {_kinds(row)}")


def _kinds(row: dict) -> str:
    return " ".join(f"{kind} {ms:.2f}" for kind, ms in row["step_ms"].items())


def _csv(text: str, cast) -> list:  # noqa: ANN001
    return [cast(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    parser = cpu_bench_parser(__doc__)
    parser.add_argument("--methods", default="ngram", help=f"comma-separated, of {', '.join(METHODS)}")
    parser.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    parser.add_argument("--batch-sizes", default="1,8,32", help="throughput rows (comma-separated)")
    parser.add_argument("--draft-model", default=DEMO_DRAFT, help="the draft_model method's checkpoint")
    parser.add_argument("--medusa-model", default=None, help="the medusa method's heads directory")
    parser.add_argument("--gpu-memory-utilization", type=float, default=None,
                        help="per engine (engines run one after the other; default: the engine's)")
    args = parser.parse_args(argv)
    methods = _csv(args.methods, str)
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        parser.error(f"--methods: unknown {unknown}; allowed: {list(METHODS)}")
    engine_args = {} if args.gpu_memory_utilization is None else {"gpu_memory_utilization":
                                                                   args.gpu_memory_utilization}
    report = run(args.model, methods, args.k, args.new_tokens, _csv(args.batch_sizes, int), engine_args,
                 args.draft_model, args.medusa_model, args.disable_tqdm)
    print_tables(report)
    write_report(args.result_file, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
