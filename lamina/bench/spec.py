"""Speculative decoding: each method against none, in one process, on CPU or GPU (issue #12).

    python -m lamina.bench.spec [--model DIR] [--methods ngram,draft_model,medusa,early_exit,eagle] [--k K]
                                [--draft-model DIR] [--medusa-model DIR] [--eagle-model DIR]
                                [--new-tokens 128] [--batch-sizes 1,8,32] [--concurrency 8,32] [--repeats 3]
                                [--result-file out.json]

Batch 1: three prompt sets kept apart (acceptance depends on the language and the task): Python code to
complete, chat turns, English prose. Each prompt runs alone, greedy and at temperature 0.6. Throughput: B
prompts (the sets' prompts in turn, seeded) submitted together at temperature 0.6, for each batch size B, and waited
for (the last ones finish with few rows beside them). Concurrency: a closed loop of 3C requests with C in
flight, output lengths uniform in [new_tokens / 2, 3 new_tokens / 2], measured while the batch is full
(lamina/bench/concurrency.py): the steady rate at batch size C, as a server under load sees it. All engines
(off and each method, with their default arguments) live at once and take turns on every row, `--repeats`
times, each repeat starting with the next engine; the median is reported (the host's noise moved single batch-1
figures by up to 2x on the H200), and in brackets the paired speed-up: the median over repeats of the ratio within
each repeat, where a slow spell of the host hits both engines.
A progress bar counts every generated token; at the end it prints the tables and writes JSON.
"""
from __future__ import annotations

import itertools
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence

import torch

from lamina import DEMO_DRAFT, DEMO_EAGLE, DEMO_MEDUSA, LLM, SamplingParams
from lamina.bench.concurrency import closed_loop_requests, steady_throughput
from lamina.bench.cpu_report import cpu_bench_parser, run_info, write_report
from lamina.bench import stalls
from lamina.engine.drafts import SpecDecodeStats
from lamina.engine.spec_gate import Arm

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
# a label suffix: the method's gate held in plain windows (SpecGate.hold): its plain steps' cost against off's (a
# measurement, not a configuration: it never drafts)
PLAIN = "-plain"
TREE = "+tree"  # a label suffix: tree drafts of BENCH_TREE's shape
GUESS = {"+guess": True, "+noguess": False}  # label suffixes: n-gram's guess_ahead on / off (default: off)
# three candidates for the next token, two after the first, one after the second, and the main chain to depth 3
# (7 nodes, lamina/spec/draft_tree.py)
BENCH_TREE = ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
# a label: a second engine without speculation, built after the others; its ratio to off is the noise floor of every
# paired ratio of the run (the same engine, in the same process, taking the same turns on the same host)
CONTROL = "control"
PLAIN_STEP = "decode ahead"  # the step kind (lamina.engine.stats.StepStats) of a plain step launched ahead
CLOSED_LOOP_REQUESTS = 3  # a concurrency row's requests, per request in flight
Workload = Callable[[LLM], tuple[int, float]]  # runs one row on an engine: (tokens, seconds)
DEMO_MODELS = {"draft_model": DEMO_DRAFT, "medusa": DEMO_MEDUSA, "eagle": DEMO_EAGLE}  # the shipped checkpoints


def spec_config(label: str, k: int | None = None, models: Mapping[str, str] = DEMO_MODELS) -> dict:
    """The speculative_config of a bench label: a method, or METHOD-fixed for that method with k fixed (the
    adaptive policy off: a tuned row), or METHOD-plain (the method's own config: `run` holds its gate in plain
    windows); any may end in @K for num_speculative_tokens K instead of `k` (None: the method's default), or in
    +tree for tree drafts of BENCH_TREE's shape; ``models``: the checkpoint of each method that has one."""
    label, _, own_k = label.partition("@")
    k = int(own_k) if own_k else k
    label, guess = _guess_suffix(label)
    tree = label.endswith(TREE)
    label = label.removesuffix(TREE)
    method = _method(label)
    shape = {"speculative_token_tree": BENCH_TREE} if tree else {} if k is None else {"num_speculative_tokens": k}
    config = {"method": method, **({"model": models[method]} if method in models else {}), **shape, **guess}
    return {**config, "adaptive": False} if label.endswith(FIXED) else config


def held_plain(label: str) -> bool:
    """Whether a bench label is METHOD-plain (its engine's gate is held in plain windows)."""
    return _base_label(label).endswith(PLAIN)


def _method(label: str) -> str:
    """The speculative method a bench label names (one of FIXED and PLAIN taken off)."""
    base = _base_label(label)
    return next((base.removesuffix(s) for s in (FIXED, PLAIN) if base.endswith(s)), base)


def _base_label(label: str) -> str:
    """METHOD, METHOD-fixed or METHOD-plain: the label without @K, a GUESS suffix and +tree."""
    return _guess_suffix(label.partition("@")[0])[0].removesuffix(TREE)


def _guess_suffix(label: str) -> tuple[str, dict]:
    """The label without a GUESS suffix, and the guess_ahead it sets ({} without one)."""
    for suffix, on in GUESS.items():
        if label.endswith(suffix):
            return label.removesuffix(suffix), {"guess_ahead": on}
    return label, {}


def _counted(llm: LLM, run: Workload) -> tuple[int, float, SpecDecodeStats, SpecDecodeStats, dict]:
    """(tokens, seconds) of `run(llm)`, the engine's spec counters before and after it, its steps by kind and where
    it stalled (lamina/bench/stalls.py)."""
    before = llm.engine.get_stats().snapshot().spec
    llm.engine.step_log = []
    with stalls.GcPauses() as pauses:
        tokens, seconds = run(llm)
    kinds, llm.engine.step_log = stalls.seconds_by_kind(llm.engine.step_log), None
    return (tokens, seconds, before, llm.engine.get_stats().snapshot().spec,
            {**_step_fields(kinds), **stalls.stall_fields(kinds), **pauses.fields()})


def _step_fields(kinds: dict[str, list[float]]) -> dict:
    """Mean and median wall time per step of each kind (prefill, decode, verify), in ms, and how many. The run's
    time outside them (`outside_steps_ms`) holds the decisions on drafts (`draft_ms`), adding requests and the
    output loop. The medians of two engines' plain steps compare their per-step cost without a slow spell's
    steps (the means hold them). `kinds`: lamina.bench.stalls.seconds_by_kind of the run's steps."""
    return {"step_ms": {kind: 1000 * sum(s) / len(s) for kind, s in kinds.items()},
            "step_ms_median": {kind: 1000 * statistics.median(s) for kind, s in kinds.items()},
            "steps": {kind: len(s) for kind, s in kinds.items()}}


def _spec_fields(before: SpecDecodeStats, after: SpecDecodeStats) -> dict:
    drafted = after.num_draft_tokens - before.num_draft_tokens
    accepted = after.num_accepted_tokens - before.num_accepted_tokens
    steps = after.num_drafts - before.num_drafts
    return {"acceptance_rate": accepted / drafted if drafted else 0.0,
            "tokens_per_verify_step": 1 + accepted / steps if steps else 0.0,
            "draft_ms": 1000 * (after.draft_seconds - before.draft_seconds),
            "plain_steps": after.plain_steps - before.plain_steps,
            "full_steps": after.full_steps - before.full_steps,
            "guessed_rows": after.guessed_rows - before.guessed_rows,
            "guessed_rows_held": after.guessed_rows_held - before.guessed_rows_held}


def _batches(batches: list[tuple[list[str], SamplingParams | list[SamplingParams]]]) -> Workload:
    """Each (prompts, params) generated as one batch, in turn."""
    def run(llm: LLM) -> tuple[int, float]:
        tokens, start = 0, time.perf_counter()
        for prompts, params in batches:
            outs = llm.generate(prompts, params, use_tqdm=False)
            tokens += sum(len(o.outputs[0].token_ids) for o in outs)
        return tokens, time.perf_counter() - start
    return run


def _closed_loop(prompts: list[str], concurrency: int, new_tokens: int) -> Workload:
    requests = closed_loop_requests(prompts, CLOSED_LOOP_REQUESTS * concurrency, new_tokens, temperature=0.6)
    return lambda llm: steady_throughput(llm.engine, requests, concurrency)


def _timed(llm: LLM, workload: Workload, bar) -> dict:  # noqa: ANN001
    """One measurement of a row: tok/s, the spec counters, the steps by kind."""
    tokens, seconds, before, after, steps = _counted(llm, workload)
    bar.update(tokens)
    in_steps = sum(steps["step_ms"][kind] * n for kind, n in steps["steps"].items())
    return {"tok_s": tokens / seconds, **_spec_fields(before, after), **steps,
            "outside_steps_ms": 1000 * seconds - in_steps}


def workloads(new_tokens: int, batch_sizes: list[int], prompt_sets: list[str] | None = None,
              concurrency: Sequence[int] = ()) -> list[tuple[dict, Workload]]:
    """(row key, workload) of every row: batch 1 per prompt set (`prompt_sets`, None: all) and temperature (each
    prompt alone), throughput per batch size (that many prompts at once, temperature 0.6), then the closed loop
    at each concurrency (temperature 0.6)."""
    rows = []
    for name in PROMPT_SETS if prompt_sets is None else prompt_sets:
        prompts = PROMPT_SETS[name]
        for temperature in TEMPERATURES:
            params = SamplingParams(temperature=temperature, max_tokens=new_tokens, ignore_eos=True, seed=0)
            rows.append(({"section": "batch_one", "prompts": name, "temperature": temperature},
                         _batches([([p], params) for p in prompts])))
    everything = [p for prompts in PROMPT_SETS.values() for p in prompts]
    for size in batch_sizes:
        # seeded: each engine samples the same text (a seeded request's tokens do not depend on drafts)
        params = [SamplingParams(temperature=0.6, max_tokens=new_tokens, ignore_eos=True, seed=i) for i in range(size)]
        rows.append(({"section": "throughput", "batch_size": size},
                     _batches([(list(itertools.islice(itertools.cycle(everything), size)), params)])))
    for size in concurrency:
        rows.append(({"section": "concurrency", "concurrency": size}, _closed_loop(everything, size, new_tokens)))
    return rows


def _median_row(key: dict, measured: list[dict]) -> dict:
    """The measurement of median tok/s among the repeats (its own counters), with every repeat's tok/s, median
    step times and where each one stalled."""
    ordered = sorted(measured, key=lambda m: m["tok_s"])
    return {**key, **ordered[len(ordered) // 2], "tok_s_repeats": [m["tok_s"] for m in measured],
            "step_ms_median_repeats": [m["step_ms_median"] for m in measured],
            "stalls_repeats": [{name: m[name] for name in stalls.FIELDS} for m in measured]}


def run(model_dir: str, methods: list[str], k: int | None, new_tokens: int, batch_sizes: list[int], engine_args: dict,
        models: Mapping[str, str] = DEMO_MODELS, repeats: int = 3,
        disable_progress: bool = False, prompt_sets: list[str] | None = None,
        concurrency: Sequence[int] = ()) -> dict:
    """Every engine is built first; then each row is measured `repeats` times, the engines taking turns within
    each repeat (so that a slow spell of the host hits them all; each repeat starts with the next engine, so that
    none always runs right after the same one), and the median is kept."""
    from tqdm.auto import tqdm

    # the control last: if an engine ran slower for being built later, the control shows it
    labels = ["off", *(m for m in methods if m != CONTROL), *(m for m in methods if m == CONTROL)]
    configs = {label: None if label in ("off", CONTROL) else spec_config(label, k, models) for label in labels}
    engines = {label: LLM(model=model_dir, speculative_config=configs[label], **engine_args) for label in labels}
    for label in labels:
        if held_plain(label):
            engines[label].engine.speculator.gate.hold(Arm.PLAIN)
    warm_up = [p for prompts in PROMPT_SETS.values() for p in prompts]  # every prompt length's kernels
    for llm in engines.values():
        llm.generate(warm_up, SamplingParams(max_tokens=8), use_tqdm=False)
    rows = workloads(new_tokens, batch_sizes, prompt_sets, concurrency)
    batch_one = len(PROMPT_SETS["code"]) * len(TEMPERATURES) * len(PROMPT_SETS if prompt_sets is None else prompt_sets)
    per_engine = (batch_one + sum(batch_sizes) + (CLOSED_LOOP_REQUESTS - 1) * sum(concurrency)) * new_tokens
    bar = tqdm(total=repeats * len(labels) * per_engine, desc="spec", unit="tok", disable=disable_progress)
    measured = {label: [[] for _ in rows] for label in labels}
    for repeat in range(repeats):
        order = turns(list(engines.items()), repeat)
        for i, (_, workload) in enumerate(rows):
            for label, llm in order:
                measured[label][i].append(_timed(llm, workload, bar))
    bar.close()
    results = {}
    for label, llm in engines.items():
        llm.engine.check_integrity()
        results[label] = {"batch_one": [], "throughput": [], "concurrency": [], "gate": _gate_state(llm)}
        for (key, _), m in zip(rows, measured[label]):
            row = _median_row(key, m)
            results[label][row.pop("section")].append(row)
    return {"workload": "speculative decoding: batch 1 per prompt set, throughput by batch size and by concurrency",
            "model": model_dir, "new_tokens": new_tokens, "repeats": repeats, "speculative_configs": configs,
            "engine_args": engine_args, "device": _device_name(), **run_info(), "results": results}


def turns(engines: list, repeat: int) -> list:
    """The engines' order in repeat `repeat` (from 0): each repeat starts with the next engine."""
    shift = repeat % len(engines)
    return engines[shift:] + engines[:shift]


def _gate_state(llm: LLM) -> dict:
    """The speculation gate's state per bucket at the end (lamina/engine/spec_gate.py), keyed "ROWS greedy" or
    "ROWS sampled"; {} without one."""
    speculator = llm.engine.speculator
    gate = speculator.gate if speculator is not None else None
    if gate is None:
        return {}
    modes = {bucket: {"mode": state.as_dict()} for bucket, state in gate.modes.items()}
    return {bucket.label: {**state.as_dict(), **modes.get(bucket, {})}
            for bucket, state in sorted(gate.buckets.items())}


def _device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def print_tables(report: dict) -> None:
    results = report["results"]
    off = results["off"]
    print("batch 1: method  prompts  T    tok/s  speed-up (paired)  acceptance  tokens/verify  ms/step by kind")
    for label, result in results.items():
        for row, base in zip(result["batch_one"], off["batch_one"]):
            print(f"  {label:12s} {row['prompts']:6s} {row['temperature']:.1f} {row['tok_s']:9.1f} "
                  f"{row['tok_s'] / base['tok_s']:8.2f}x ({_paired(row, base):.2f}x) {row['acceptance_rate']:11.2f} "
                  f"{row['tokens_per_verify_step']:14.2f}  {_kinds(row)}")
    print("throughput: method  batch  tok/s  vs off (paired)  acceptance  ms outside steps (drafting)  ms/step by kind")
    for section, size in (("throughput", "batch_size"), ("concurrency", "concurrency")):
        for label, result in results.items():
            for row, base in zip(result.get(section, []), off.get(section, [])):
                print(f"  {label:12s} {row[size]:5d} {row['tok_s']:10.1f} {row['tok_s'] / base['tok_s']:7.2f}x "
                      f"({_paired(row, base):.2f}x) {row['acceptance_rate']:11.2f} {row['outside_steps_ms']:9.1f} "
                      f"({row['draft_ms']:.1f})  {_kinds(row)}")
                print(f"    repeats: {_repeats(row)}")
                if (plain := _plain_step_ratio(row, base)) is not None:
                    print(f"    a plain step (decode ahead, each repeat's median) against off's: {plain:.3f}x the time")
        if section == "throughput" and any(result.get("concurrency") for result in results.values()):
            print("concurrency (closed loop, the batch kept full): method  in flight  tok/s  vs off (paired)  ...")


def _paired(row: dict, base: dict) -> float:
    """The median over repeats of the ratio within each repeat (the engines take turns, so a slow spell of the
    host hits both of one repeat)."""
    return _upper_median([a / b for a, b in zip(row["tok_s_repeats"], base["tok_s_repeats"])])


def _plain_step_ratio(row: dict, base: dict) -> float | None:
    """The median over repeats of the ratio of the two engines' median plain step (launched ahead): what a step
    costs the engine with speculation on while it does not speculate, against off. None without such steps."""
    ratios = [a[PLAIN_STEP] / b[PLAIN_STEP] for a, b in zip(row["step_ms_median_repeats"],
                                                            base["step_ms_median_repeats"])
              if PLAIN_STEP in a and PLAIN_STEP in b]
    return _upper_median(ratios) if ratios else None


def _upper_median(values: list[float]) -> float:
    """The median of an odd count, the upper of the two middle values of an even one."""
    return sorted(values)[len(values) // 2]


def _repeats(row: dict) -> str:
    """Each repeat's tok/s with its stalled steps' lost ms and its garbage collections' ms (lamina/bench/stalls.py)."""
    return " / ".join(f"{tok_s:.0f} (stalls {s['stall_steps']}: {s['stall_ms']:.0f} ms, gc {s['gc_ms']:.0f} ms)"
                      for tok_s, s in zip(row["tok_s_repeats"], row["stalls_repeats"]))


def _kinds(row: dict) -> str:
    return " ".join(f"{kind} {ms:.2f}" for kind, ms in row["step_ms"].items())


def _csv(text: str, cast) -> list:  # noqa: ANN001
    return [cast(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    parser = cpu_bench_parser(__doc__)
    parser.add_argument("--methods", default="ngram",
                        help=f"comma-separated, of {', '.join(METHODS)}; METHOD{FIXED}: with k fixed (no policy); "
                             f"METHOD{PLAIN}: held in plain windows (what its plain steps cost; it never drafts); "
                             f"{' / '.join(GUESS)}: n-gram's guess_ahead on / off (default: off); any with "
                             f"@K: num_speculative_tokens K (ngram@7); {CONTROL}: a second engine without "
                             "speculation, built last (the paired ratios' noise floor)")
    parser.add_argument("--k", type=int, default=None, help="num_speculative_tokens (default: each method's own)")
    parser.add_argument("--batch-sizes", default="1,8,32", help="throughput rows (comma-separated)")
    parser.add_argument("--concurrency", default="8,32",
                        help="closed-loop rows: requests in flight (comma-separated; empty: none)")
    parser.add_argument("--prompt-sets", default=",".join(PROMPT_SETS),
                        help=f"batch-1 rows: comma-separated, of {', '.join(PROMPT_SETS)} (empty: none)")
    parser.add_argument("--draft-model", default=DEMO_DRAFT, help="the draft_model method's checkpoint")
    parser.add_argument("--medusa-model", default=DEMO_MEDUSA, help="the medusa method's heads directory")
    parser.add_argument("--eagle-model", default=DEMO_EAGLE, help="the eagle method's head directory")
    parser.add_argument("--repeats", type=int, default=3, help="measurements of each row (the median is kept)")
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=None,
                        help="per engine (all engines live at once; default on CUDA: 4 GiB each)")
    args = parser.parse_args(argv)
    methods = _csv(args.methods, str)
    unknown = sorted(m for m in methods if m != CONTROL and (
        _method(m) not in METHODS or not (m.partition("@")[2] or "3").isdigit()))
    if unknown:
        parser.error(f"--methods: unknown {unknown}; allowed: {list(METHODS)}, each optionally with {FIXED} or "
                     f"{PLAIN}, then {TREE}, then {' or '.join(GUESS)}, then @K; or {CONTROL} (a second engine without "
                     "speculation)")
    prompt_sets = _csv(args.prompt_sets, str)
    if unknown_sets := sorted(set(prompt_sets) - PROMPT_SETS.keys()):
        parser.error(f"--prompt-sets: unknown {unknown_sets}; allowed: {list(PROMPT_SETS)}")
    kv_bytes = args.kv_cache_memory_bytes or (4 << 30 if torch.cuda.is_available() else None)
    engine_args = {} if kv_bytes is None else {"kv_cache_memory_bytes": kv_bytes}
    report = run(args.model, methods, args.k, args.new_tokens, _csv(args.batch_sizes, int), engine_args,
                 {"draft_model": args.draft_model, "medusa": args.medusa_model, "eagle": args.eagle_model},
                 args.repeats, args.disable_tqdm, prompt_sets, _csv(args.concurrency, int))
    print_tables(report)
    write_report(args.result_file, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
