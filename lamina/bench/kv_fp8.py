"""The fp8 KV cache (kv_cache_dtype="fp8", issue #13's stretch goal) against the model's dtype, in one process.

    python -m lamina.bench.kv_fp8 [--model DIR] [--windows 64] [--result-file out.json]

Accuracy, on the demo model (or --model): the held-out text `lamina quantize` evaluates with
(lamina/quantize/data/heldout_python.jsonl), cut into 128-token windows, scored by the engine itself
(prompt_logprobs, so the cache is written and read as in serving): perplexity, and the mean |difference| of the
per-token log-probabilities; greedy continuations of the spec bench's 24 prompts, 64 tokens: how many tokens
before the first difference; for three sets of scales: measured at start-up on random tokens (the default), in
the checkpoint from the calibration text (`lamina quantize --kv-cache-scheme fp8`'s rule), and all 1.0. KV
capacity: blocks for the same kv_cache_memory_bytes. Speed is W1's
(`python -m lamina.bench.offline --workload w1 --kv-cache-dtype fp8`). Prints a table last, writes JSON.
"""
from __future__ import annotations

import math
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from lamina import LLM, SamplingParams
from lamina.bench.cpu_report import cpu_bench_parser, run_info, write_report
from lamina.bench.spec import PROMPT_SETS

WINDOW = 128
CONTINUATION = 64


def held_out_windows(llm: LLM, count: int) -> list[list[int]]:
    from lamina.quantize.evaluate import DEFAULT_EVAL_TEXT, read_eval_texts, token_windows

    return token_windows(read_eval_texts(DEFAULT_EVAL_TEXT), llm.engine.tokenizer, WINDOW, None)[:count]


def token_logprobs(llm: LLM, windows: list[list[int]]) -> list[list[float]]:
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": w} for w in windows], params, use_tqdm=False)
    return [[next(iter(entry.values())).logprob for entry in out.prompt_logprobs[1:]] for out in outs]


def continuations(llm: LLM) -> list[list[int]]:
    prompts = [p for prompts in PROMPT_SETS.values() for p in prompts]
    params = SamplingParams(temperature=0, max_tokens=CONTINUATION, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


def measure(model: str, kv_cache_dtype: str, windows: list[list[int]] | None, num_windows: int) -> dict:
    llm = LLM(model=model, kv_cache_dtype=kv_cache_dtype, kv_cache_memory_bytes=1 << 28)
    windows = windows if windows is not None else held_out_windows(llm, num_windows)
    logprobs = token_logprobs(llm, windows)
    llm.engine.check_integrity()
    return {"kv_cache_dtype": kv_cache_dtype, "kv_blocks": llm.engine.num_blocks, "windows": windows,
            "logprobs": logprobs, "continuations": continuations(llm)}


def compare(base: dict, fp8: dict) -> dict:
    pairs = [(a, b) for wa, wb in zip(base["logprobs"], fp8["logprobs"]) for a, b in zip(wa, wb)]
    agree = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x))
             for x, y in zip(base["continuations"], fp8["continuations"])]
    return {"tokens_scored": len(pairs),
            "ppl_auto": math.exp(-sum(a for a, _ in pairs) / len(pairs)),
            "ppl_fp8": math.exp(-sum(b for _, b in pairs) / len(pairs)),
            "mean_abs_logprob_diff": sum(abs(a - b) for a, b in pairs) / len(pairs),
            "greedy_identical": sum(n == CONTINUATION for n in agree), "greedy_prompts": len(agree),
            "greedy_tokens_before_first_difference": agree,
            "kv_blocks_auto": base["kv_blocks"], "kv_blocks_fp8": fp8["kv_blocks"]}


def scaled_copies(model: str, root: Path) -> dict[str, str]:
    """The model with KV scales in its checkpoint: measured on `lamina quantize`'s default calibration text, and
    all 1.0 (what an fp8 cache without scales would store)."""
    from lamina.loader.hf_config import load_model_arch
    from lamina.loader.tokenizer import Tokenizer
    from lamina.quantize.calibration import (DEFAULT_CALIB_TEXT, DEFAULT_NUM_SAMPLES, DEFAULT_SEQ_LEN,
                                             calibration_sequences, read_calib_texts)
    from lamina.quantize.kv_scales import add_kv_scales, write_kv_scales

    arch = load_model_arch(model)
    text, ones = root / "text", root / "ones"
    for path in (text, ones):
        shutil.copytree(model, path)
    sequences = calibration_sequences(read_calib_texts(DEFAULT_CALIB_TEXT), Tokenizer.from_pretrained(model),
                                      DEFAULT_NUM_SAMPLES, min(DEFAULT_SEQ_LEN, arch.max_position_embeddings))
    add_kv_scales(str(text), sequences)
    unit = torch.ones(arch.num_key_value_heads)
    write_kv_scales(str(ones), {f"model.layers.{i}.self_attn": (unit, unit) for i in range(arch.num_hidden_layers)})
    return {"scales measured at start-up (random tokens)": model,
            "scales measured on calibration text (lamina quantize --kv-cache-scheme fp8)": str(text),
            "every scale 1.0": str(ones)}


def main(argv: list[str] | None = None) -> int:
    parser = cpu_bench_parser(__doc__)
    parser.add_argument("--windows", type=int, default=64, help="held-out windows of 128 tokens to score")
    args = parser.parse_args(argv)
    base = measure(args.model, "auto", None, args.windows)
    with tempfile.TemporaryDirectory() as root:
        variants = {name: compare(base, measure(path, "fp8", base["windows"], args.windows))
                    for name, path in scaled_copies(args.model, Path(root)).items()}
    report = {"workload": "fp8 KV cache against the model's dtype: held-out perplexity, greedy agreement",
              "model": args.model, **run_info(), "results": variants}
    first = next(iter(variants.values()))
    print(f"held-out tokens {first['tokens_scored']}, perplexity {first['ppl_auto']:.4f} with the model's dtype "
          f"({first['kv_blocks_auto']} KV blocks; fp8: {first['kv_blocks_fp8']})")
    print(f"{'fp8 KV cache':78s} {'perplexity':>10s} {'vs auto':>8s} {'mean |d lp|':>11s} {'greedy same':>11s}")
    for name, row in variants.items():
        print(f"{name:78s} {row['ppl_fp8']:10.4f} {row['ppl_fp8'] / row['ppl_auto'] - 1:+8.2%} "
              f"{row['mean_abs_logprob_diff']:11.4f} {row['greedy_identical']:>5d} / {row['greedy_prompts']}")
    write_report(args.result_file, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
