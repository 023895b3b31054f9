"""How often a prompt-lookup draft is accepted, by the length of the match it continues (issue #12).

    python scripts/ngram_match_stats.py [--model DIR] [--new-tokens 256] [--result-file out.json]

Generates the spec bench's prompts (lamina.bench.spec.PROMPT_SETS) greedily and at temperature 0.6 (seed 1), then
at every generated position takes the longest earlier match of the sequence's end (up to 5 tokens) and the 7 tokens
that followed it, as n-gram drafting with k = 7 would: per match length, how many positions, how often the first
draft equals the next token, and how many drafts in a row are accepted on average. The figures behind n-gram's
default k and the match-length policy (lamina/engine/match_acceptance.py).
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from lamina import DEMO_MODEL, LLM, SamplingParams
from lamina.bench.spec import PROMPT_SETS
from lamina.spec.ngram import most_recent_match_ends

K, LONGEST = 7, 5


def longest_match(history: np.ndarray) -> tuple[int, int]:
    """(n, end) of the longest earlier match of history's last n tokens, n <= LONGEST; (0, -1) without one."""
    best = (0, -1)
    for n in range(1, LONGEST + 1):
        end = int(most_recent_match_ends(history, np.array([0]), np.array([len(history)]), n, n)[0])
        if end < 0:
            break
        best = (n, end)
    return best


def match_stats(seqs: list[tuple[list[int], int]]) -> dict[int, list[int]]:
    """n -> [positions, first draft accepted, drafts accepted in a row (summed)] over (tokens, prompt length)."""
    stats: dict[int, list[int]] = {}
    for seq, start in seqs:
        for t in range(start, len(seq) - 1):
            n, end = longest_match(np.array(seq[:t + 1]))
            row = stats.setdefault(n, [0, 0, 0])
            row[0] += 1
            if n:
                drafts, actual = seq[end + 1:min(end + 1 + K, t + 1)], seq[t + 1:t + 1 + K]
                accepted = next((i for i, (d, a) in enumerate(zip(drafts, actual)) if d != a),
                                min(len(drafts), len(actual)))
                row[1] += accepted > 0
                row[2] += accepted
    return stats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEMO_MODEL)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--result-file")
    args = parser.parse_args()
    llm, report = LLM(model=args.model), {}
    print("prompts  T    n: positions, first accepted, mean accepted of 7")
    for temperature in (0.0, 0.6):
        for name, prompts in PROMPT_SETS.items():
            params = SamplingParams(temperature=temperature, max_tokens=args.new_tokens, ignore_eos=True, seed=1)
            outs = llm.generate(prompts, params, use_tqdm=False)
            stats = match_stats([(list(o.prompt_token_ids) + list(o.outputs[0].token_ids), len(o.prompt_token_ids))
                                 for o in outs])
            rows = {n: {"positions": c, "first_accepted": f / c, "mean_accepted": a / c}
                    for n, (c, f, a) in sorted(stats.items())}
            report[f"{name} T={temperature}"] = rows
            print(f"{name:6s} {temperature:.1f}  " + "  ".join(
                f"{n}: {r['positions']}, {r['first_accepted']:.2f}, {r['mean_accepted']:.2f}" for n, r in rows.items()))
    if args.result_file:
        with open(args.result_file, "w") as f:
            json.dump({"model": args.model, "new_tokens": args.new_tokens, "k": K, "rows": report}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
