"""`lamina quantize` (quantize, evaluate, gate, write) and `lamina eval` (the same evaluation alone)."""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lamina import DEMO_MODEL, __version__
from lamina.quant.recipe import get_recipe, method_names
from lamina.quant.rtn4 import DEFAULT_GROUP_SIZE
from lamina.quantize.calibration import DEFAULT_NUM_SAMPLES, DEFAULT_SEQ_LEN
from lamina.quantize.gate import budgets, code_eval, not_better, over_budget, table

SUMMARY = "quantize_summary.json"
METHODS = [*method_names(), "gptq", "awq", "smoothquant"]  # the last three: lamina/quantize/methods.py
GATE_FAILED = 1  # exit status when over budget (errors exit 2, as in every lamina command)

QUANTIZE_DESCRIPTION = """\
Quantize a Hugging Face checkpoint (Llama, Mistral, Qwen2, Qwen3) and write it in the compressed-tensors
format that lamina, vLLM and transformers load (see docs/quantization.md).

  int8         W8A16: int8 weights, one symmetric scale per output channel (round to nearest)
  llm_int8     LLM.int8(): int8 as above, int8 activations per token, input columns over 6.0 in 16-bit
  w8a8         W8A8 int8: int8 weights per channel, int8 activations per token (dynamic), round to nearest
  smoothquant  W8A8 as w8a8, calibrated: SmoothQuant (outliers migrated into the weights; --alpha, 0.5)
  fp8          FP8 W8A8: e4m3 weights per channel, e4m3 activations per token (dynamic)
  rtn4         W4A16: int4 weights, a scale and zero point per group of --group-size input columns (RTN)
  gptq         W4A16 as rtn4, calibrated: GPTQ (Hessian-based error compensation; --act-order)
  awq          W4A16 as rtn4, calibrated: AWQ (activation-aware channel scales, clipping)

--kv-cache-scheme fp8 adds static fp8 KV cache scales, one per KV head, measured on the calibration text
through the quantized model; the gate then scores the checkpoint with an fp8 KV cache, as it runs with
kv_cache_dtype="fp8".

Calibration (gptq, awq, smoothquant, --kv-cache-scheme): --num-samples sequences of up to 512 tokens from
--calib (a .jsonl file of {"text": ...} lines; default: Python source shipped with lamina that the gate's
held-out text does not overlap). Layers are calibrated one after another on the outputs of the layers already
quantized.

Accuracy gate: the quantized checkpoint is evaluated against MODEL with lamina's own forward (torch, float32):
perplexity on held-out text, the mean KL divergence of the next-token distributions, and the exact match of
--code-cases greedy completions of lines of held-out Python functions (through the engine). Over budget, nothing
is written and the exit status is 1, unless --force. Default budgets: int8 and llm_int8 +1 % perplexity and
KL 0.01; w8a8, smoothquant and fp8 +2 % and KL 0.02; rtn4, gptq and awq +5 % and KL 0.1; code exact match at
most 2 points (8-bit) or 5 points (4-bit) below the unquantized model's; and gptq / awq must
have a lower perplexity than rtn4 with the same group size (the gate quantizes with rtn4 too and shows it in
the table; smoothquant shows w8a8 beside it). Default held-out text: Python
source shipped with lamina (lamina/quantize/data/).
DIR receives the checkpoint and quantize_summary.json (options, metrics, budgets).
"""


def _add_eval_args(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--eval-text", default=None, metavar="FILE",
      help="held-out text: a .jsonl file of {'text': ...} lines or any text file (default: lamina's sample)")
    a("--window", type=int, default=512, help="tokens per scored window (default 512)")
    a("--max-eval-tokens", type=int, default=None, metavar="N", help="score at most N tokens (default: all)")
    a("--device", default="cpu", help="where the evaluation runs: cpu (default), cuda, cuda:N")
    a("--code-cases", type=int, default=128, metavar="N",
      help="code-completion lines to complete greedily, spread over the held-out functions (default 128; 0: off)")
    a("--code-functions", default=None, metavar="FILE.jsonl", help="held-out functions, one {'text': ...} a line")


def _add_calibration_args(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--calib", default=None, metavar="FILE.jsonl",
      help="calibration text for gptq / awq, one {'text': ...} a line (default: lamina's sample)")
    a("--num-samples", type=int, default=None, metavar="N",
      help=f"calibration sequences of up to {DEFAULT_SEQ_LEN} tokens, gptq / awq (default {DEFAULT_NUM_SAMPLES})")
    a("--act-order", action="store_true",
      help="gptq: quantize columns by decreasing activation energy (groups stay in place: actorder 'static')")
    a("--alpha", type=float, default=None, help="smoothquant: migration strength in [0, 1] (default 0.5)")


def register(sub: argparse._SubParsersAction) -> None:
    q = sub.add_parser("quantize", help="quantize a checkpoint (int8, llm_int8, w8a8, smoothquant, fp8, rtn4, gptq, "
                                        "awq), check its accuracy, write it",
                       description=QUANTIZE_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    q.add_argument("model", help="the unquantized model directory")
    q.add_argument("--method", required=True, choices=METHODS, help="see above")
    q.add_argument("--group-size", type=int, default=None,
                   help=f"input columns per scale group, rtn4 / gptq / awq (default {DEFAULT_GROUP_SIZE})")
    q.add_argument("--output", required=True, metavar="DIR", help="where to write the quantized checkpoint")
    q.add_argument("--force", action="store_true", help="write the checkpoint even when over budget")
    q.add_argument("--max-ppl-increase", type=float, default=None, metavar="PCT",
                   help="perplexity budget, percent over the unquantized model (default: int8 1, rtn4 5)")
    q.add_argument("--max-kl", type=float, default=None, metavar="NATS",
                   help="mean KL budget per token (default: int8 0.01, rtn4 0.1)")
    q.add_argument("--max-em-drop", type=float, default=None, metavar="POINTS",
                   help="code-completion exact-match points the result may lose (default: 8-bit 2, 4-bit 5)")
    q.add_argument("--ignore", nargs="*", default=["lm_head"], metavar="TARGET",
                   help="layers left unquantized: names or 're:<regex>' (default: lm_head)")
    q.add_argument("--no-progress", action="store_true", help="no progress bar")
    q.add_argument("--kv-cache-scheme", default=None, choices=["fp8"],
                   help="also write static fp8 KV cache scales per KV head, measured on the calibration text "
                        "(compressed-tensors' kv_cache_scheme; used by kv_cache_dtype='fp8')")
    _add_calibration_args(q)
    _add_eval_args(q)
    q.set_defaults(func=run_quantize)
    e = sub.add_parser("eval", help="perplexity of a model on held-out text; with --baseline, KL against it",
                       description="Evaluate MODEL as `lamina quantize` does: perplexity on held-out text and, "
                                   "with --baseline, the mean KL divergence and top-1 agreement against it.")
    e.add_argument("model", nargs="?", default=DEMO_MODEL, help="a model directory (default: the demo model)")
    e.add_argument("--baseline", default=None, metavar="MODEL", help="the model to compare against")
    e.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")
    _add_eval_args(e)
    e.set_defaults(func=run_eval)


def _windows(args: argparse.Namespace, model_dir: str) -> list[list[int]]:
    from lamina.loader.tokenizer import Tokenizer
    from lamina.quantize.evaluate import DEFAULT_EVAL_TEXT, read_eval_texts, token_windows

    texts = read_eval_texts(args.eval_text or DEFAULT_EVAL_TEXT)
    return token_windows(texts, Tokenizer.from_pretrained(model_dir), args.window, args.max_eval_tokens)


def _check_output(path: Path) -> None:
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ValueError(f"--output {str(path)!r} exists and is not an empty directory; choose another or remove it")


def _group_size(args: argparse.Namespace, recipe: Any) -> int:
    if not recipe.uses_group_size:
        if args.group_size is not None:
            raise ValueError(f"--group-size: {recipe.name} has one scale per output channel; it takes no group size")
        return 0
    size = DEFAULT_GROUP_SIZE if args.group_size is None else args.group_size
    if size <= 0:
        raise ValueError(f"--group-size must be a positive integer, got {size}")
    return size


def _calibration(args: argparse.Namespace, calibrated: Any) -> list[list[int]] | None:
    """The calibration sequences of a calibrated method or of --kv-cache-scheme (None for the others, which refuse
    the options)."""
    _check_calibration_flags(args, calibrated)
    if calibrated is None and args.kv_cache_scheme is None:
        return None
    from lamina.loader.hf_config import load_model_arch
    from lamina.loader.tokenizer import Tokenizer
    from lamina.quantize.calibration import DEFAULT_CALIB_TEXT, calibration_sequences, read_calib_texts

    texts = read_calib_texts(args.calib or DEFAULT_CALIB_TEXT)
    seq_len = min(DEFAULT_SEQ_LEN, load_model_arch(args.model).max_position_embeddings)
    num_samples = DEFAULT_NUM_SAMPLES if args.num_samples is None else args.num_samples
    return calibration_sequences(texts, Tokenizer.from_pretrained(args.model), num_samples, seq_len)


def _check_calibration_flags(args: argparse.Namespace, calibrated: Any) -> None:
    if calibrated is None:
        text = args.kv_cache_scheme is None  # --kv-cache-scheme measures its scales on the calibration text
        for flag, given in (("--calib", text and args.calib is not None),
                            ("--num-samples", text and args.num_samples is not None),
                            ("--act-order", args.act_order), ("--alpha", args.alpha is not None)):
            if given:
                raise ValueError(f"{flag}: {args.method} uses no calibration data (gptq, awq and smoothquant do; "
                                 "--calib and --num-samples also serve --kv-cache-scheme)")
        return
    if args.act_order and not calibrated.takes_act_order:
        raise ValueError(f"--act-order: {args.method} has no activation order (gptq only)")
    if args.alpha is not None and not (calibrated.takes_alpha and 0.0 <= args.alpha <= 1.0):
        raise ValueError(f"--alpha: smoothquant only, within [0, 1]; got {args.alpha} for {args.method}")


def _quantize(args: argparse.Namespace, directory: Path, recipe: Any, calibrated: Any, group_size: int,
              sequences: list[list[int]] | None) -> tuple[Any, dict[str, str]]:
    from lamina.quantize.methods import quantize_calibrated
    from lamina.quantize.writer import quantize_checkpoint

    progress = not args.no_progress
    if calibrated is None:
        return quantize_checkpoint(args.model, str(directory), recipe, group_size, tuple(args.ignore), progress), {}
    assert sequences is not None
    return quantize_calibrated(args.model, str(directory), calibrated, group_size, tuple(args.ignore), sequences,
                               args.act_order, progress, args.alpha)


def _kv_scales(args: argparse.Namespace, directory: Path, sequences: list[list[int]] | None) -> dict[str, Any] | None:
    """--kv-cache-scheme: the KV scales measured on the calibration text into the staged checkpoint."""
    if args.kv_cache_scheme is None:
        return None
    from lamina.quantize.kv_scales import add_kv_scales

    assert sequences is not None
    start = time.perf_counter()
    layers = add_kv_scales(str(directory), sequences, progress=not args.no_progress)
    tokens = sum(map(len, sequences))
    print(f"fp8 KV cache scales of {layers} layers measured on {tokens} calibration tokens in "
          f"{time.perf_counter() - start:.1f} s", file=sys.stderr)
    return {"scheme": args.kv_cache_scheme, "layers": layers, "strategy": "attn_head",
            "calibration": {"text": args.calib or "lamina/quantize/data/calib_python.jsonl",
                            "sequences": len(sequences), "tokens": tokens}}


def _reference(args: argparse.Namespace, directory: Path, name: str, group_size: int,
               windows: list[list[int]], sequences: list[list[int]] | None) -> Any:
    """The reference method's (rtn4's) evaluation, from a checkpoint quantized into `directory` (with KV scales
    too under --kv-cache-scheme, so that both are scored with the same cache)."""
    from lamina.quantize.evaluate import evaluate
    from lamina.quantize.writer import quantize_checkpoint

    quantize_checkpoint(args.model, str(directory), get_recipe(name), group_size, tuple(args.ignore),
                        progress=not args.no_progress)
    _kv_scales(args, directory, sequences)
    return evaluate(str(directory), windows, args.model, args.device)


def run_quantize(args: argparse.Namespace) -> int:
    from lamina.quantize.evaluate import evaluate
    from lamina.quantize.methods import CALIBRATED

    calibrated = CALIBRATED.get(args.method)
    recipe = calibrated.recipe if calibrated else get_recipe(args.method)
    limits, group_size, output = budgets(args, recipe), _group_size(args, recipe), Path(args.output)
    _check_output(output)
    windows = _windows(args, args.model)
    sequences = _calibration(args, calibrated)
    staging = output.with_name(f".{output.name}.partial")
    reference_dir = output.with_name(f".{output.name}.reference.partial")
    for directory in (staging, reference_dir):
        shutil.rmtree(directory, ignore_errors=True)
    try:
        done, notes = _quantize(args, staging, recipe, calibrated, group_size, sequences)
        print(f"quantized {len(done.quantized)} layers with {recipe.name}: {done.bytes_before / 1e6:.1f} MB -> "
              f"{done.bytes_after / 1e6:.1f} MB of weights in {done.seconds:.1f} s", file=sys.stderr)
        kv_summary = _kv_scales(args, staging, sequences)
        start = time.perf_counter()
        result = evaluate(str(staging), windows, args.model, args.device)
        code = code_eval(args, str(staging), args.model)
        reference = (_reference(args, reference_dir, calibrated.baseline, group_size, windows, sequences)
                     if calibrated else None)
        reference_name = calibrated.baseline if calibrated else None
        must_beat = bool(calibrated and calibrated.must_beat)  # smoothquant shows w8a8 without having to beat it
        print(table(result, recipe.name, limits, reference, reference_name, code, must_beat=must_beat))
        failures = over_budget(result, limits["ppl"], limits["kl"], code, limits["em"])
        if reference is not None and must_beat:
            failures += not_better(result, reference, recipe.name, reference_name)
        extra = (_calibration_summary(args, sequences, notes, reference, reference_name, must_beat)
                 if calibrated else {})
        extra["code_completion"] = None if code is None else {**asdict(code), "em_drop": code.em_drop}
        extra["kv_cache_scheme"] = kv_summary
        _write_summary(staging, args, recipe, done, result, limits, failures, time.perf_counter() - start, extra)
        if failures and not args.force:
            print(f"lamina quantize: {'; '.join(failures)}: nothing written (--force writes it anyway)",
                  file=sys.stderr)
            return GATE_FAILED
        if output.exists():
            output.rmdir()  # empty (checked above): the staged directory takes its place
        staging.rename(output)
    finally:
        for directory in (staging, reference_dir):
            shutil.rmtree(directory, ignore_errors=True)
    note = f" despite: {'; '.join(failures)}" if failures else ""
    print(f"wrote {output}{note}", file=sys.stderr)
    return 0


def _calibration_summary(args: argparse.Namespace, sequences: list[list[int]] | None, notes: dict[str, str],
                         reference: Any, reference_name: str | None, must_beat: bool) -> dict[str, Any]:
    assert sequences is not None
    return {"calibration": {"text": args.calib or "lamina/quantize/data/calib_python.jsonl",
                            "sequences": len(sequences), "tokens": sum(map(len, sequences)),
                            "act_order": args.act_order, "alpha": args.alpha, "layers": notes},
            "reference": {"method": reference_name, **asdict(reference), "ppl_increase": reference.ppl_increase,
                          "must_beat": must_beat}}


def _write_summary(directory: Path, args: argparse.Namespace, recipe: Any, done: Any, result: Any,
                   budgets: dict[str, float], failures: list[str], eval_seconds: float,
                   extra: dict[str, Any]) -> None:
    limits = {"max_ppl_increase": budgets["ppl"], "max_kl": budgets["kl"], "max_em_drop": budgets["em"]}
    if extra.get("reference", {}).get("must_beat"):
        limits["better_than"] = extra["reference"]["method"]
    summary = {
        "lamina_version": __version__, "model": str(args.model), "method": recipe.name,
        "weights": asdict(done.args), "ignore": list(args.ignore), "quantized_layers": len(done.quantized),
        "weight_bytes": {"before": done.bytes_before, "after": done.bytes_after},
        "quantize_seconds": round(done.seconds, 2), **{k: v for k, v in extra.items() if k == "calibration"},
        "evaluation": {"text": args.eval_text or "lamina/quantize/data/heldout_python.jsonl", "window": args.window,
                       "engine": f"lamina model forward, torch reference path, float32"
                                 f"{', fp8 KV cache' if args.kv_cache_scheme else ''}, {args.device}",
                       "seconds": round(eval_seconds, 2), **asdict(result), "ppl_increase": result.ppl_increase},
        **{k: v for k, v in extra.items() if k in ("reference", "code_completion", "kv_cache_scheme")},
        "budgets": limits, "passed": not failures, "failures": failures, "forced": bool(args.force and failures),
    }
    (directory / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")


def run_eval(args: argparse.Namespace) -> int:
    from lamina.quantize.evaluate import evaluate

    result = evaluate(args.model, _windows(args, args.model), args.baseline, args.device)
    code = code_eval(args, args.model, args.baseline)
    print(table(result, Path(args.model).name or "model", code=code))
    if args.json:
        code_json = None if code is None else {**asdict(code), "em_drop": code.em_drop}
        Path(args.json).write_text(json.dumps({"model": args.model, "baseline": args.baseline, **asdict(result),
                                               "ppl_increase": result.ppl_increase, "code_completion": code_json},
                                              indent=2) + "\n")
    return 0
