"""Check an lm-evaluation-harness run against lamina serve: each logged loglikelihood equals HF transformers' own.

    python3 scripts/lm_eval/check_against_hf.py SAMPLES.jsonl [MODEL_DIR]     (MODEL_DIR: the demo model)

SAMPLES.jsonl is what `lm_eval ... --log_samples` wrote for a loglikelihood task. Each (context, continuation)
is split into tokens as lm-eval's API models split it (trailing spaces of the context moved to the
continuation, the continuation's tokens those of the whole text after the context's), scored by transformers in
float32, and compared with the loglikelihood and is-greedy that lamina returned through /v1/completions.
"""
from __future__ import annotations

import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lamina import DEMO_MODEL


def split(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:  # noqa: ANN001
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tokenizer.encode(context + continuation, add_special_tokens=False)
    return whole, whole[len(tokenizer.encode(context, add_special_tokens=False)):]


def main(samples: str, model_dir: str = DEMO_MODEL) -> int:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    worst, mismatched, rows = 0.0, 0, [json.loads(line) for line in open(samples)]
    for row in rows:
        args = row["arguments"]["gen_args_0"]
        whole, continuation = split(tokenizer, args["arg_0"], args["arg_1"])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(torch.tensor([whole])).logits[0].float(), dim=-1)
        rows_of = range(len(whole) - len(continuation) - 1, len(whole) - 1)
        ll = sum(float(logprobs[p, t]) for p, t in zip(rows_of, continuation))
        greedy = all(int(logprobs[p].argmax()) == t for p, t in zip(rows_of, continuation))
        got_ll, got_greedy = row["resps"][0][0]
        worst = max(worst, abs(ll - float(got_ll)))
        mismatched += greedy != (str(got_greedy) == "True")
    print(f"{len(rows)} requests: max |loglikelihood difference| {worst:.2e}, is-greedy mismatches {mismatched}")
    return 0 if worst < 1e-3 and not mismatched else 1


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
