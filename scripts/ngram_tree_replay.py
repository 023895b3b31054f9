"""Would n-gram drafts in a tree pay? An offline replay on the demo model's own texts (issue #12).

    PYTHONPATH=. python scripts/ngram_tree_replay.py [--new-tokens 256] [--k 7]

Generates the bench's 24 prompts (lamina.bench.spec.PROMPT_SETS) without speculation, seeded at T = 0.6 and greedy,
then replays drafting over each text as a verify step would see it: from position t, the drafts are accepted while
they equal the text's next tokens (a sampled row's token depends only on its seed and position, so the text is what
the verify rows would draw). The chain is lamina's n-gram proposer (the most recent match of the longest suffix,
k drafts); a tree of m candidates is the trie of the continuations of the m most recent distinct matches (longest
suffix first), at most m * k nodes, accepting its longest run. Prints tokens a verify step and drafted nodes a
step for each set and rule, assuming every step drafts (the adaptive policy drafts less).
"""
from __future__ import annotations

import argparse
from collections.abc import Callable

from lamina import DEMO_MODEL, LLM, SamplingParams
from lamina.bench.spec import PROMPT_SETS
from lamina.spec.ngram import NgramProposer

TREE_WIDTHS = (2, 3, 4, 8)


def continuations(tokens: list[int], k: int, n_min: int, n_max: int) -> list[list[int]]:
    """The k tokens after each earlier occurrence of the text's last n tokens: n from n_max down, then the most
    recent first; one per occurrence end."""
    found, ends, size = [], set(), len(tokens)
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        suffix = tokens[size - n:]
        for end in range(size - 2, n - 2, -1):
            if end not in ends and tokens[end - n + 1:end + 1] == suffix:
                ends.add(end)
                found.append(tokens[end + 1:end + 1 + k])
    return found


def tree_rule(chain: NgramProposer, m: int) -> Callable[[list[int]], list[list[int]]]:
    """The drafts of a tree of m candidates: the first m distinct continuations, matched as `chain` matches."""
    def propose(tokens: list[int]) -> list[list[int]]:
        distinct = dict.fromkeys(tuple(c) for c in continuations(tokens, chain.num_speculative_tokens,
                                                                  chain.prompt_lookup_min, chain.prompt_lookup_max))
        return [list(c) for c in distinct][:m]
    return propose


def trie_size(paths: list[list[int]]) -> int:
    return len({tuple(p[:i]) for p in paths for i in range(1, len(p) + 1)})


def accepted(drafts: list[list[int]], future: list[int]) -> int:
    """The longest run of the text's next tokens that one of `drafts` starts with."""
    best = 0
    for path in drafts:
        run = 0
        while run < len(path) and run < len(future) and path[run] == future[run]:
            run += 1
        best = max(best, run)
    return best


def replay(texts: list[tuple[list[int], list[int]]], propose: Callable[[list[int]], list[list[int]]]
           ) -> tuple[float, float]:
    """(tokens a verify step, drafted nodes a step) over every text."""
    steps = tokens = nodes = 0
    for prompt, output in texts:
        full, t = prompt + output, len(prompt)
        while t < len(full):
            drafts = propose(full[:t])
            run = min(accepted(drafts, full[t:]), len(full) - t - 1)
            steps, tokens, nodes, t = steps + 1, tokens + run + 1, nodes + trie_size(drafts), t + run + 1
    return tokens / steps, nodes / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--k", type=int, default=7, help="drafts a candidate (the n-gram default)")
    args = parser.parse_args()
    llm, k = LLM(DEMO_MODEL), args.k
    chain = NgramProposer(k)
    rules = {"chain": lambda text: [d] if (d := chain.propose([text], [k])[0]) else []}
    rules.update((f"tree of {m}", tree_rule(chain, m)) for m in TREE_WIDTHS)
    print(f"{'set':6s} {'T':4s} " + "  ".join(f"{name:>12s}" for name in rules) + "   (tokens a step / nodes a step)")
    for name, prompts in PROMPT_SETS.items():
        for temperature in (0.6, 0.0):
            params = [SamplingParams(temperature=temperature, seed=i, max_tokens=args.new_tokens, ignore_eos=True)
                      for i in range(len(prompts))]
            texts = [(list(o.prompt_token_ids), list(o.outputs[0].token_ids))
                     for o in llm.generate(prompts, params, use_tqdm=False)]
            cells = ["%5.2f / %4.1f" % replay(texts, rule) for rule in rules.values()]
            print(f"{name:6s} {temperature:<4} " + "  ".join(f"{c:>12s}" for c in cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
