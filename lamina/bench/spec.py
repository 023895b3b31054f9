"""Speculative decoding: each method against none, in one process, on CPU or GPU (issue #12).

    python -m lamina.bench.spec [--model DIR] [--methods ngram,draft_model,medusa,early_exit,eagle] [--k K]
                                [--new-tokens 128] [--batch-sizes 1,8,32] [--repeats 3] [--result-file out.json]

Batch 1: three prompt sets kept apart (acceptance depends on the language and the task): Python code to
complete, chat turns, English prose. Each prompt runs alone, greedy and at temperature 0.6. Throughput: B
prompts (the sets' prompts in turn) submitted together at temperature 0.6, for each batch size B. All engines
(off, then each method, with their default arguments) live at once and take turns on every row, `--repeats`
times; the median is reported (the host's noise moved single batch-1 figures by up to 2x on the H200).
A progress bar counts every generated token; at the end it prints the tables and writes JSON.
"""
from __future__ import annotations

import itertools
import sys
import time

import torch

from lamina import DEMO_DRAFT, DEMO_EAGLE, DEMO_MEDUSA, LLM, SamplingParams
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
METHODS = ("ngram", "draft_model", "medusa", "early_exit", "eagle")
FIXED = "-fixed"  # a label suffix: the method with the adaptive policy off


def spec_config(label: str, k: int | None = None, draft_model: str = DEMO_DRAFT,
                medusa_model: str = DEMO_MEDUSA) -> dict:
    """The speculative_config of a bench label: a method, or METHOD-fixed for that method with k fixed (the
    adaptive policy off: a tuned row); either may end in @K for num_speculative_tokens K instead of `k` (None:
    the method's default)."""
    label, _, own_k = label.partition("@")
    k = int(own_k) if own_k else k
    method = label.removesuffix(FIXED)
    models = {"draft_model": draft_model, "medusa": medusa_model, "eagle": DEMO_EAGLE}
    config = {"method": method, **({"model": models[method]} if method in models else {}),
              **({} if k is None else {"num_speculative_tokens": k})}
    return {**config, "adaptive": False} if label.endswith(FIXED) else config


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
    """Mean wall time per step of each kind (prefill, decode, verify), in ms, and how many. The run's time outside
    them (`outside_steps_ms`) holds the decisions on drafts (`draft_ms`), adding requests and the output loop."""
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
            "tokens_per_verify_step": 1 + accepted / steps if steps else 0.0,
            "draft_ms": 1000 * (after.draft_seconds - before.draft_seconds)}


def _timed(llm: LLM, batches: list[tuple[list[str], SamplingParams]], bar) -> dict:  # noqa: ANN001
    """One measurement: each (prompts, params) generated as one batch, in turn; tok/s over all of them."""
    def run() -> int:
        tokens = 0
        for prompts, params in batches:
            outs = llm.generate(prompts, params, use_tqdm=False)
            tokens += sum(len(o.outputs[0].token_ids) for o in outs)
        bar.update(tokens)
        return tokens
    tokens, seconds, before, after, steps = _counted(llm, run)
    in_steps = sum(steps["step_ms"][kind] * n for kind, n in steps["steps"].items())
    return {"tok_s": tokens / seconds, **_spec_fields(before, after), **steps,
            "outside_steps_ms": 1000 * seconds - in_steps}


def workloads(new_tokens: int, batch_sizes: list[int], prompt_sets: list[str] | None = None,
              ) -> list[tuple[dict, list[tuple[list[str], SamplingParams]]]]:
    """(row key, batches) of every row: batch 1 per prompt set (`prompt_sets`, None: all) and temperature (each
    prompt alone), then throughput per batch size (that many prompts at once, temperature 0.6)."""
    rows = []
    for name in PROMPT_SETS if prompt_sets is None else prompt_sets:
        prompts = PROMPT_SETS[name]
        for temperature in TEMPERATURES:
            params = SamplingParams(temperature=temperature, max_tokens=new_tokens, ignore_eos=True, seed=0)
            rows.append(({"section": "batch_one", "prompts": name, "temperature": temperature},
                         [([p], params) for p in prompts]))
    everything = [p for prompts in PROMPT_SETS.values() for p in prompts]
    for size in batch_sizes:
        params = SamplingParams(temperature=0.6, max_tokens=new_tokens, ignore_eos=True)
        rows.append(({"section": "throughput", "batch_size": size},
                     [(list(itertools.islice(itertools.cycle(everything), size)), params)]))
    return rows


def _median_row(key: dict, measured: list[dict]) -> dict:
    """The measurement of median tok/s among the repeats (its own counters), with every repeat's tok/s."""
    ordered = sorted(measured, key=lambda m: m["tok_s"])
    return {**key, **ordered[len(ordered) // 2], "tok_s_repeats": [m["tok_s"] for m in measured]}


def run(model_dir: str, methods: list[str], k: int | None, new_tokens: int, batch_sizes: list[int], engine_args: dict,
        draft_model: str = DEMO_DRAFT, medusa_model: str = DEMO_MEDUSA, repeats: int = 3,
        disable_progress: bool = False, prompt_sets: list[str] | None = None) -> dict:
    """Every engine is built first; then each row is measured `repeats` times, the engines taking turns within
    each repeat (so that a slow spell of the host hits them all), and the median is kept."""
    from tqdm.auto import tqdm

    labels = ["off", *methods]
    configs = {label: None if label == "off" else spec_config(label, k, draft_model, medusa_model) for label in labels}
    engines = {label: LLM(model=model_dir, speculative_config=configs[label], **engine_args) for label in labels}
    warm_up = [p for prompts in PROMPT_SETS.values() for p in prompts]  # every prompt length's kernels
    for llm in engines.values():
        llm.generate(warm_up, SamplingParams(max_tokens=8), use_tqdm=False)
    rows = workloads(new_tokens, batch_sizes, prompt_sets)
    batch_one = sum(len(batches) for key, batches in rows if key["section"] == "batch_one")
    per_engine = (batch_one + sum(batch_sizes)) * new_tokens
    bar = tqdm(total=repeats * len(labels) * per_engine, desc="spec", unit="tok", disable=disable_progress)
    measured = {label: [[] for _ in rows] for label in labels}
    for _ in range(repeats):
        for i, (_, batches) in enumerate(rows):
            for label, llm in engines.items():
                measured[label][i].append(_timed(llm, batches, bar))
    bar.close()
    results = {}
    for label, llm in engines.items():
        llm.engine.check_integrity()
        results[label] = {"batch_one": [], "throughput": []}
        for (key, _), m in zip(rows, measured[label]):
            row = _median_row(key, m)
            results[label][row.pop("section")].append(row)
    return {"workload": "speculative decoding: batch 1 per prompt set, and throughput by batch size",
            "model": model_dir, "new_tokens": new_tokens, "repeats": repeats, "speculative_configs": configs,
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
    print("throughput: method  batch  tok/s  vs off (paired)  acceptance  ms outside steps (drafting)  ms/step by kind")
    for label, result in results.items():
        for row, base in zip(result["throughput"], off["throughput"]):
            print(f"  {label:12s} {row['batch_size']:5d} {row['tok_s']:10.1f} {row['tok_s'] / base['tok_s']:7.2f}x "
                  f"({_paired(row, base):.2f}x) {row['acceptance_rate']:11.2f} {row['outside_steps_ms']:9.1f} "
                  f"({row['draft_ms']:.1f})  {_kinds(row)}")


def _paired(row: dict, base: dict) -> float:
    """The median over repeats of the ratio within each repeat (the engines take turns, so a slow spell of the
    host hits both of one repeat)."""
    ratios = sorted(a / b for a, b in zip(row["tok_s_repeats"], base["tok_s_repeats"]))
    return ratios[len(ratios) // 2]


def _kinds(row: dict) -> str:
    return " ".join(f"{kind} {ms:.2f}" for kind, ms in row["step_ms"].items())


def _csv(text: str, cast) -> list:  # noqa: ANN001
    return [cast(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    parser = cpu_bench_parser(__doc__)
    parser.add_argument("--methods", default="ngram",
                        help=f"comma-separated, of {', '.join(METHODS)}; METHOD{FIXED}: with k fixed (no policy); "
                             "either with @K: num_speculative_tokens K (ngram@7)")
    parser.add_argument("--k", type=int, default=None, help="num_speculative_tokens (default: each method's own)")
    parser.add_argument("--batch-sizes", default="1,8,32", help="throughput rows (comma-separated)")
    parser.add_argument("--prompt-sets", default=",".join(PROMPT_SETS),
                        help=f"batch-1 rows: comma-separated, of {', '.join(PROMPT_SETS)} (empty: none)")
    parser.add_argument("--draft-model", default=DEMO_DRAFT, help="the draft_model method's checkpoint")
    parser.add_argument("--medusa-model", default=DEMO_MEDUSA, help="the medusa method's heads directory")
    parser.add_argument("--repeats", type=int, default=3, help="measurements of each row (the median is kept)")
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=None,
                        help="per engine (all engines live at once; default on CUDA: 4 GiB each)")
    args = parser.parse_args(argv)
    methods = _csv(args.methods, str)
    unknown = sorted(m for m in methods if m.partition("@")[0].removesuffix(FIXED) not in METHODS
                     or not (m.partition("@")[2] or "3").isdigit())
    if unknown:
        parser.error(f"--methods: unknown {unknown}; allowed: {list(METHODS)}")
    prompt_sets = _csv(args.prompt_sets, str)
    if unknown_sets := sorted(set(prompt_sets) - PROMPT_SETS.keys()):
        parser.error(f"--prompt-sets: unknown {unknown_sets}; allowed: {list(PROMPT_SETS)}")
    kv_bytes = args.kv_cache_memory_bytes or (4 << 30 if torch.cuda.is_available() else None)
    engine_args = {} if kv_bytes is None else {"kv_cache_memory_bytes": kv_bytes}
    report = run(args.model, methods, args.k, args.new_tokens, _csv(args.batch_sizes, int), engine_args,
                 args.draft_model, args.medusa_model, args.repeats, args.disable_tqdm, prompt_sets)
    print_tables(report)
    write_report(args.result_file, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
