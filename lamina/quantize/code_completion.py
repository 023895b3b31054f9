"""The gate's code-completion metric: complete the lines of held-out Python functions, greedy, with the engine.

Perplexity averages over every token; int4 weights hurt the tokens that matter for code (names, operators,
the exact call) more than it shows, so the gate also asks each model to write code: for every body line of
the held-out functions (lamina/quantize/data/heldout_functions.jsonl), the model gets the function up to
that line and completes it greedily to the end of the line; the line is exact when it equals the
reference (trailing spaces aside). The quantized model is compared with the reference code and with the
unquantized model's own completions:

    def active_count():                            prompt: the function's tokens up to the last token
        \"\"\"Return the number of ...\"\"\"             boundary before the line's first character (a
        with _active_limbo_lock:                   natural prefix of the tokenized function: cutting at
    ─── cut ───────────────────────────────────    "\\n" itself would leave a token the model never saw
            return len(_active) + len(_limbo)      there), then greedy up to "\\n"

Whole bodies at once would give a 17M-parameter model an exact match of 0 for any weights; lines keep the
metric sensitive. The prompts of one function are prefixes of one token list: the functions are run once
first, and the lines are then prefix-cache hits (the engine's own cache), so all of it costs little more
than one pass over the functions and one batch of short greedy lines.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lamina.jsonl import read_jsonl

if TYPE_CHECKING:
    from lamina import LLM

DEFAULT_FUNCTIONS = str(Path(__file__).parent / "data" / "heldout_functions.jsonl")
MAX_LINE_TOKENS = 64


@dataclass(frozen=True)
class CompletionCase:
    function: int  # index of its function (cases of one function share its tokens as a prefix)
    prompt_token_ids: list[int]
    target: str  # the rest of the line after the prompt, without its newline


@dataclass(frozen=True)
class CodeResult:
    cases: int
    exact_match: float  # share of lines equal to the reference
    baseline_exact_match: float | None = None
    agreement: float | None = None  # share of lines equal to the baseline model's own completion

    @property
    def em_drop(self) -> float | None:
        """Exact-match points lost against the baseline (positive: worse)."""
        return None if self.baseline_exact_match is None else 100 * (self.baseline_exact_match - self.exact_match)


def read_functions(path: str) -> list[str]:
    """The function sources of a .jsonl file of {"text": ...} lines."""
    if not Path(path).is_file():
        raise ValueError(f"--code-functions: {path!r} is not a file")
    texts = [row.get("text") if isinstance(row, dict) else None for _, row in read_jsonl(path, "--code-functions")]
    if not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"--code-functions {path}: every line needs a string 'text' field (a function's source)")
    return texts


def body_lines(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the non-blank lines after the docstring of the function in `text`."""
    tree = ast.parse(text)
    func = tree.body[0] if tree.body else None
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise ValueError(f"code functions: expected a function definition, got {text[:60]!r}")
    first = func.body[1] if ast.get_docstring(func) is not None and len(func.body) > 1 else func.body[0]
    spans, start = [], 0
    for number, line in enumerate(text.split("\n"), 1):
        if number >= first.lineno and line.strip():
            spans.append((start, start + len(line)))
        start += len(line) + 1
    return spans


def function_cases(index: int, text: str, tokenizer) -> list[CompletionCase]:
    """One case per body line whose first character starts a token boundary region (module docstring)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    ends = [len(tokenizer.decode(ids[:k + 1], skip_special_tokens=False)) for k in range(len(ids))]
    cases = []
    for start, end in body_lines(text):
        content = start + len(text[start:end]) - len(text[start:end].lstrip())
        k = max((k for k, e in enumerate(ends) if e <= content), default=None)
        if k is not None and ends[k] >= start:  # the prompt holds the whole line before (its newline too)
            cases.append(CompletionCase(index, ids[:k + 1], text[ends[k]:end].rstrip()))
    return cases


def completion_cases(texts: list[str], tokenizer, max_cases: int | None = None,
                     max_function_tokens: int | None = None) -> list[CompletionCase]:
    """Every function's cases; `max_cases` keeps that many, spread evenly over the list. A function longer than
    `max_function_tokens` (the model's context less a line) is left out."""
    cases = [case for i, text in enumerate(texts) for case in function_cases(i, text, tokenizer)]
    if max_function_tokens is not None:
        too_long = {i for i, text in enumerate(texts)
                    if len(tokenizer.encode(text, add_special_tokens=False)) > max_function_tokens}
        cases = [c for c in cases if c.function not in too_long]
    if max_cases is not None and max_cases < len(cases):
        cases = [cases[i * len(cases) // max_cases] for i in range(max_cases)]
    return cases


def complete_lines(llm: LLM, cases: list[CompletionCase], texts: list[str]) -> list[str]:
    """The model's greedy completion of each case's line. The functions are computed first (one token each), so
    the cases, all in one batch, hit the prefix cache for all but their last block."""
    from lamina import SamplingParams

    tokenizer = llm.get_tokenizer()
    functions = sorted({c.function for c in cases})
    llm.generate([{"prompt_token_ids": tokenizer.encode(texts[f], add_special_tokens=False)} for f in functions],
                 SamplingParams(max_tokens=1), use_tqdm=False)
    greedy = SamplingParams(temperature=0, max_tokens=MAX_LINE_TOKENS, stop=["\n"])
    results = llm.generate([{"prompt_token_ids": c.prompt_token_ids} for c in cases], greedy, use_tqdm=False)
    return [r.outputs[0].text.rstrip() for r in results]


def evaluate_code(model_dir: str, baseline_dir: str | None, texts: list[str], max_cases: int | None,
                  device: str = "cpu") -> CodeResult:
    """Exact match of `model_dir`'s greedy lines (lamina's engine, float32 on `device`, an fp8 KV cache where the
    checkpoint has its scales); with `baseline_dir`, also the baseline's and the agreement of the two."""
    from lamina import LLM
    from lamina.quantize.evaluate import checkpoint_kv_cache_dtype

    lines: dict[str, list[str]] = {}
    cases: list[CompletionCase] = []
    for name, path in (("model", model_dir), ("baseline", baseline_dir)):
        if path is None:
            continue
        llm = LLM(model=path, dtype="float32", device=device.split(":")[0],
                  kv_cache_dtype=checkpoint_kv_cache_dtype(path))
        if not cases:
            cases = completion_cases(texts, llm.get_tokenizer(), max_cases, llm.engine.max_model_len - MAX_LINE_TOKENS)
            if not cases:
                raise ValueError(f"--code-functions: no function fits the model's context ({llm.engine.max_model_len} "
                                 "tokens)")
        lines[name] = complete_lines(llm, cases, texts)
        llm.shutdown()
    return score(lines["model"], cases, lines.get("baseline"))


def score(lines: list[str], cases: list[CompletionCase], baseline_lines: list[str] | None = None) -> CodeResult:
    exact = sum(line == case.target for line, case in zip(lines, cases)) / len(cases)
    if baseline_lines is None:
        return CodeResult(len(cases), exact)
    base = sum(line == case.target for line, case in zip(baseline_lines, cases)) / len(cases)
    agree = sum(a == b for a, b in zip(lines, baseline_lines)) / len(cases)
    return CodeResult(len(cases), exact, base, agree)
