"""Why an adaptive engine drafts or not at batch 1 (issue #12): each step of the prompt sets' requests, run one at a
time, with the gate's arm and the policy's view after it, summarised per window of 16 steps.

    PYTHONPATH=. python scripts/trace_spec_policy.py [--methods draft_model] [--prompt-sets code,chat,prose]
                                                     [--temperatures 0,0.6] [--new-tokens 256] [--result-file t.json]

Per window (printed for each set's first prompt, all in the JSON): the steps run in the gate's plain arm, the
steps by kind with their mean wall time, the drafts verified, and at its end the policy's acceptance estimate of
the running request, its engine-wide prior and its cost model's cost(1) and cost(q) (a verify step's tokens under
a CUDA graph, q = 1 + k rounded up to a captured query length). A run whose windows are SPEC but verify nothing is
the policy's refusal; PLAIN windows, the gate's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lamina import DEMO_MODEL, LLM, SamplingParams
from lamina.bench.spec import PROMPT_SETS, spec_config
from lamina.engine.engine import LLMEngine
from lamina.engine.spec_gate import WINDOW


def trace(engine: LLMEngine, prompt: str, params: SamplingParams) -> list[dict]:
    """One request alone, step by step: each step's record."""
    speculator = engine.speculator
    policy, gate = speculator.policy, speculator.gate
    q = policy.step_tokens([1 + speculator.k])  # a one-row verify step's tokens as the policy counts them
    engine.step_log, records = [], []
    engine.add_request(prompt, params)
    while engine.has_unfinished_requests():
        plain = gate.plain
        engine.step()
        step = engine.step_log[-1]
        running = engine.scheduler.running
        records.append({"kind": step.kind, "ms": 1000 * step.seconds, "plain": plain,
                        "drafts": step.num_tokens - step.num_rows,
                        "alpha": policy.alpha(running[0].request_id) if running else None,
                        "prior": policy.prior(), "cost_1_ms": 1000 * float(policy.cost.cost(1)),
                        "cost_q_ms": 1000 * float(policy.cost.cost(q))})
    engine.step_log = None
    return records


def windows(records: list[dict]) -> list[dict]:
    """Each window of WINDOW steps: steps in a plain window, [count, mean ms] by kind, drafts verified, and the
    policy's view at its end."""
    out = []
    for start in range(0, len(records), WINDOW):
        part, kinds = records[start:start + WINDOW], {}
        for r in part:
            kinds.setdefault(r["kind"], []).append(r["ms"])
        last = part[-1]
        out.append({"start": start, "steps": len(part), "plain": sum(r["plain"] for r in part),
                    "ms_by_kind": {k: [len(v), round(statistics.mean(v), 3)] for k, v in sorted(kinds.items())},
                    "drafts": sum(r["drafts"] for r in part),
                    "alpha": None if last["alpha"] is None else round(last["alpha"], 3),
                    **{key: round(last[key], 3) for key in ("prior", "cost_1_ms", "cost_q_ms")}})
    return out


def window_line(w: dict) -> str:
    by_kind = " ".join(f"{k} {n}x{ms:.2f}" for k, (n, ms) in w["ms_by_kind"].items())
    alpha = "-" if w["alpha"] is None else f"{w['alpha']:.2f}"
    return (f"    steps {w['start']:4d}+ plain {w['plain']:2d}/{w['steps']:2d}  {by_kind:48s} drafts {w['drafts']:3d}  "
            f"alpha {alpha} prior {w['prior']:.2f} cost(1) {w['cost_1_ms']:.2f} cost(q) {w['cost_q_ms']:.2f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default="draft_model")
    parser.add_argument("--prompt-sets", default="code,chat,prose")
    parser.add_argument("--temperatures", default="0,0.6")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--result-file", default=None)
    args = parser.parse_args()
    engine_args = {"kv_cache_memory_bytes": 4 << 30} if torch.cuda.is_available() else {}
    result = {}
    for label in args.methods.split(","):
        llm = LLM(model=DEMO_MODEL, speculative_config=spec_config(label), **engine_args)
        llm.generate(PROMPT_SETS["code"][:1], SamplingParams(max_tokens=16), use_tqdm=False)  # compiles, first use
        result[label] = []
        for name in args.prompt_sets.split(","):
            for temperature in (float(t) for t in args.temperatures.split(",")):
                for i, prompt in enumerate(PROMPT_SETS[name]):
                    params = SamplingParams(max_tokens=args.new_tokens, temperature=temperature, seed=i,
                                            ignore_eos=True)
                    records = trace(llm.engine, prompt, params)
                    verify = [r["ms"] for r in records if r["kind"] == "verify"]
                    row = {"prompts": name, "temperature": temperature, "prompt": i, "steps": len(records),
                           "plain": sum(r["plain"] for r in records), "verify": len(verify),
                           "verify_ms_median": statistics.median(verify) if verify else None,
                           "windows": windows(records)}
                    result[label].append(row)
                    print(f"{label} {name} T={temperature} prompt {i}: {row['steps']} steps, {row['plain']} plain, "
                          f"{len(verify)} verify" + (f" ({row['verify_ms_median']:.2f} ms median)" if verify else ""))
                    if i == 0:
                        print("\n".join(map(window_line, row["windows"])))
        del llm
    if args.result_file:
        Path(args.result_file).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
