"""Evaluate the demo models: held-out perplexity, greedy agreement of drafts with the teacher, samples.

    python scripts/demo_model/evaluate.py --data DATA --teacher lamina/assets/demo-model \\
        --draft distilled=lamina/assets/demo-draft --draft ce-baseline=OUT/draft-ce --out results.json

Writes one JSON: per model its parameters and held-out perplexity, per draft its agreement (k look-ahead),
and greedy completions of a few prompts (plain and through the chat template).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from lamina.device import resolve_device
from lamina.distill.checkpoint import count_parameters
from lamina.distill.data import TokenData
from lamina.distill.evaluate import greedy_agreement, perplexity

PROMPTS = ["def fibonacci(n):", "class Stack:\n    def __init__(self):", "import os\n\n\ndef list_python_files(root):"]
CHAT = [{"role": "user", "content": "Write a Python function `is_prime(n)`: Return True if n is a prime number."}]


def load(path: str, device: torch.device) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()


def samples(model: torch.nn.Module, model_dir: str, max_new_tokens: int) -> dict[str, str]:
    """Greedy completions of PROMPTS and of the CHAT request (rendered with the shipped chat template)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    device = next(model.parameters()).device
    chat_prompt = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    out = {}
    for prompt in [*PROMPTS, chat_prompt]:
        ids = torch.tensor([tok.encode(prompt, add_special_tokens=False)], device=device)
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        out[prompt] = tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=False)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--teacher", required=True)
    p.add_argument("--draft", action="append", default=[], metavar="NAME=DIR", help="a draft to evaluate")
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--eval-tokens", type=int, default=None, help="held-out tokens to score (default all)")
    p.add_argument("--positions", type=int, default=2048, help="positions for the agreement rate")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--device", default="auto")
    args = p.parse_args()
    device = resolve_device(args.device)
    data = TokenData.load(args.data)
    start = time.perf_counter()
    models = {"teacher": args.teacher, **dict(d.split("=", 1) for d in args.draft)}
    teacher = load(args.teacher, device)
    result: dict = {"date": time.strftime("%Y-%m-%d"), "heldout_tokens_total": int(len(data.heldout)), "models": {}}
    for name, path in models.items():
        if not Path(path, "config.json").is_file():
            print(f"skipping {name}: no checkpoint at {path}", flush=True)
            continue
        model = teacher if name == "teacher" else load(path, device)
        entry = {"path": path, "params": count_parameters(model),
                 "heldout": perplexity(model, data.heldout, args.seq_len, max_tokens=args.eval_tokens)}
        if name != "teacher":
            entry["agreement"] = greedy_agreement(model, teacher, data.heldout, k=args.k,
                                                  positions=args.positions).to_dict()
        entry["samples"] = samples(model, path, args.max_new_tokens)
        result["models"][name] = entry
        print(name, json.dumps({k: v for k, v in entry.items() if k != "samples"}), flush=True)
    result["eval_seconds"] = round(time.perf_counter() - start, 1)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for name, entry in result["models"].items():
        print(f"--- {name}: {entry['samples'][PROMPTS[0]]!r}")


if __name__ == "__main__":
    main()
