"""Offline estimate (issue #12, the CPU bar): how often a corpus n-gram table's one-token draft would be accepted at
T = 0.6, over all positions and where prompt lookup finds no match (the last token not seen before in the text).

    PYTHONPATH=. python scripts/table_drafter_estimate.py [--result-file F]

Tables: the most frequent next token after each token (bigram) and after each pair (trigram, falling back to the
bigram) over up to 30 M characters of this interpreter's standard library (the demo model's kind of text; test
files left out), tokenized with the demo tokenizer. Texts: the bench's 24 prompts (lamina.bench.spec.PROMPT_SETS),
128 tokens each, sampled by lamina at T = 0.6 (seeded); a position's acceptance is p_T(draft), the target's
probability of the table's token at T = 0.6 (HF transformers' forward over the text).
"""
from __future__ import annotations

import argparse
import glob
import json
import os

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

from lamina import DEMO_MODEL, LLM, SamplingParams
from lamina.bench.spec import PROMPT_SETS

MAX_CHARS = 30_000_000
TEMPERATURE = 0.6


def corpus_ids(tokenizer: Tokenizer) -> np.ndarray:
    stdlib = os.path.dirname(os.__file__)
    texts, chars = [], 0
    for path in sorted(glob.glob(os.path.join(stdlib, "**", "*.py"), recursive=True)):
        if "site-packages" in path or "/test" in path or chars > MAX_CHARS:
            continue
        try:
            with open(path, encoding="utf-8") as f:
                texts.append(f.read())
        except (UnicodeDecodeError, OSError):
            continue
        chars += len(texts[-1])
    return np.concatenate([np.array(e.ids, dtype=np.int64) for e in tokenizer.encode_batch(texts)])


def argmax_table(context: np.ndarray, following: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(contexts, their most frequent next token), from parallel arrays of context keys and next tokens."""
    keys, counts = np.unique(np.stack([context, following]), axis=1, return_counts=True)
    order = np.lexsort((counts, keys[0]))  # by context, then count: the last of each context is its argmax
    return keys[0][order], keys[1][order]


def acceptances(llm: LLM, hf: torch.nn.Module, prompts: list[str], bigram: np.ndarray, trigram: dict[int, int],
                vocab: int) -> dict:
    """Mean p_T(draft) of the bigram and trigram drafts, over every position and over the positions without a
    prompt-lookup match."""
    got: dict[str, dict[str, list[float]]] = {k: {"bigram": [], "trigram": []} for k in ("all", "no_match")}
    for seed, prompt in enumerate(prompts):
        params = SamplingParams(temperature=TEMPERATURE, max_tokens=128, seed=seed, ignore_eos=True)
        out = llm.generate([prompt], params, use_tqdm=False)[0]
        seq = list(out.prompt_token_ids) + list(out.outputs[0].token_ids)
        with torch.no_grad():
            probs = torch.softmax(hf(torch.tensor([seq])).logits[0].float() / TEMPERATURE, -1).numpy()
        for j in range(len(out.prompt_token_ids), len(seq)):  # the draft for seq[j], from seq[:j]
            last = seq[j - 1]
            bi = int(bigram[last])
            tri = trigram.get(seq[j - 2] * vocab + last, bi) if j >= 2 else bi
            for where in ("all",) if last in seq[:j - 1] else ("all", "no_match"):
                got[where]["bigram"].append(probs[j - 1, bi] if bi >= 0 else 0.0)
                got[where]["trigram"].append(probs[j - 1, tri] if tri >= 0 else 0.0)
    return {where: {"positions": len(v["bigram"]), **{k: float(np.mean(x)) for k, x in v.items()}}
            for where, v in got.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--result-file", default=None)
    args = parser.parse_args()
    tokenizer = Tokenizer.from_file(os.path.join(DEMO_MODEL, "tokenizer.json"))
    vocab = tokenizer.get_vocab_size()
    ids = corpus_ids(tokenizer)
    contexts, nexts = argmax_table(ids[:-1], ids[1:])
    bigram = np.full(vocab, -1, dtype=np.int64)
    bigram[contexts] = nexts
    pairs, pair_nexts = argmax_table(ids[:-2] * vocab + ids[1:-1], ids[2:])
    trigram = dict(zip(pairs.tolist(), pair_nexts.tolist()))
    print(f"corpus: {len(ids) / 1e6:.1f} M tokens, {len(trigram)} token pairs")
    llm = LLM(model=DEMO_MODEL)
    hf = AutoModelForCausalLM.from_pretrained(DEMO_MODEL, dtype=torch.float32).eval()
    results = {name: acceptances(llm, hf, prompts, bigram, trigram, vocab) for name, prompts in PROMPT_SETS.items()}
    for name, result in results.items():
        print(name, json.dumps(result))
    if args.result_file:
        with open(args.result_file, "w") as f:
            json.dump({"corpus_tokens": int(len(ids)), "temperature": TEMPERATURE, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
