"""Does launching ahead while no match is in sight pay for n-gram's FULL windows? An offline replay (issue #12).

    PYTHONPATH=. python scripts/ngram_lookahead_replay.py [--new-tokens 256] [--k 7] [--greedy-ms 0.435,0.327,0.222]
                                                         [--sampled-ms 0.497,0.428,0.352]

Generates the bench's 24 prompts (lamina.bench.spec.PROMPT_SETS) without speculation, greedy and seeded at T = 0.6
(a sampled row's token depends only on its seed and position, so the text is what verify rows would draw), then
replays batch 1 two ways (lamina/engine/speculator.py's docstring):

    after   every step waits for the tokens before it and drafts at every match (k fixed; FULL before the look)
    look    while the tokens read so far hold no match, the next step is launched ahead of the token in flight;
            a match in sight makes the step after it wait for its tokens and draft from them

and prices the step mix with the given step costs in ms (a verify step, a step whose successor waits for its tokens,
a step whose successor was launched ahead; defaults: an H100's medians, thirty-sixth session, demo model). Prints
each schedule's steps and its rate relative to off (every step launched ahead).
"""
from __future__ import annotations

import argparse
from collections import Counter

from lamina import DEMO_MODEL, LLM, SamplingParams
from lamina.bench.spec import PROMPT_SETS
from lamina.spec.ngram import NgramProposer


def replay(tokens: list[int], start: int, proposer: NgramProposer, look: bool) -> Counter:
    """The steps of one text from position `start` on: 'verify', 'sync' (its successor waited), 'ahead'."""
    steps: Counter = Counter()
    pos, in_flight = start, False  # in_flight: the step computing tokens[pos] was launched, its successor not yet
    while pos < len(tokens):
        if in_flight:  # a look at tokens[:pos]: wait for the step in flight, or launch the next one ahead
            waits = bool(proposer.propose([tokens[:pos]], [1])[0])
            steps["sync" if waits else "ahead"] += 1
            pos, in_flight = pos + 1, not waits
            continue
        drafts = proposer.propose([tokens[:pos]], [proposer.num_speculative_tokens])[0]
        accepted = next((j for j, d in enumerate(drafts) if pos + j >= len(tokens) or tokens[pos + j] != d),
                        len(drafts))
        if drafts:
            steps["verify"] += 1
            pos += accepted + 1
        elif look:
            in_flight = True  # a plain step for tokens[pos]; the one after it is launched ahead
        else:
            steps["sync"] += 1
            pos += 1
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--greedy-ms", default="0.435,0.327,0.222", help="verify, sync, ahead step costs at T = 0")
    parser.add_argument("--sampled-ms", default="0.497,0.428,0.352", help="the same at T = 0.6")
    args = parser.parse_args()
    llm = LLM(DEMO_MODEL)
    proposer = NgramProposer(args.k, 1, 4)
    print(f"{'prompts':8} {'T':4} {'schedule':8} {'verify':>7} {'sync':>6} {'ahead':>6} {'x off':>6}")
    for name, prompts in PROMPT_SETS.items():
        for temperature, costs in ((0.0, args.greedy_ms), (0.6, args.sampled_ms)):
            verify_ms, sync_ms, ahead_ms = (float(c) for c in costs.split(","))
            params = SamplingParams(temperature=temperature, max_tokens=args.new_tokens, ignore_eos=True, seed=1)
            texts = [(len(o.prompt_token_ids), list(o.prompt_token_ids) + list(o.outputs[0].token_ids))
                     for o in llm.generate(prompts, params, use_tqdm=False)]
            generated = sum(len(t) - s for s, t in texts)
            for look in (False, True):
                steps = sum((replay(t, s, proposer, look) for s, t in texts), Counter())
                ms = steps["verify"] * verify_ms + steps["sync"] * sync_ms + steps["ahead"] * ahead_ms
                print(f"{name:8} {temperature:<4} {'look' if look else 'after':8} {steps['verify']:7} "
                      f"{steps['sync']:6} {steps['ahead']:6} {generated * ahead_ms / ms:6.2f}")


if __name__ == "__main__":
    main()
