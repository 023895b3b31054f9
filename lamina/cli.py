"""The `lamina` command: generate, chat, distill."""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from collections.abc import Iterator
from typing import TYPE_CHECKING

from lamina import DEMO_MODEL
from lamina.cli_args import add_engine_args, add_sampling_args, engine_kwargs, sampling_params
from lamina.outputs import RequestOutput
from lamina.sampling_params import SamplingParams

if TYPE_CHECKING:  # the engine pulls in torch: import it only when a command runs
    from lamina.llm import LLM


def _model_args(parser: argparse.ArgumentParser, max_tokens: int) -> None:
    parser.add_argument("--model", default=DEMO_MODEL, help="a local HF model directory (default: the demo model)")
    add_engine_args(parser)
    add_sampling_args(parser, {"max_tokens": max_tokens})


def _make_llm(args: argparse.Namespace) -> LLM:
    from lamina.llm import LLM

    return LLM(model=args.model, **engine_kwargs(args))


def _stream_one(llm: LLM, prompt: str, params: SamplingParams) -> None:
    engine = llm.engine
    request_id = engine.add_request(prompt, params)
    printed = 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.request_id != request_id:
                continue
            text = output.outputs[0].text
            sys.stdout.write(text[printed:])
            sys.stdout.flush()
            printed = len(text)
    sys.stdout.write("\n")


def _read_jsonl(path: str) -> list[dict]:
    rows = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"--input {path}: line {number} is not valid JSON ({err.msg})") from err
        if isinstance(row, str):
            row = {"prompt": row}
        if not isinstance(row, dict) or not ("prompt" in row or "prompt_token_ids" in row):
            raise ValueError(f"--input {path}: line {number} needs a 'prompt' or 'prompt_token_ids' field")
        rows.append(row)
    return rows


def _output_row(row: dict, output: RequestOutput) -> dict:
    samples = [{"text": c.text, "token_ids": c.token_ids, "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason} for c in output.outputs]
    result = {**row, "prompt_token_ids": output.prompt_token_ids, **samples[0]}
    if len(samples) > 1:
        result["samples"] = samples
    return result


def _batch(llm: LLM, args: argparse.Namespace, params: SamplingParams) -> None:
    rows = _read_jsonl(args.input)
    prompts = [{k: r[k] for k in ("prompt", "prompt_token_ids") if k in r} for r in rows]
    outputs = llm.generate(prompts, params, use_tqdm=True)
    lines = [json.dumps(_output_row(r, o), ensure_ascii=False) for r, o in zip(rows, outputs)]
    text = "\n".join(lines) + "\n"
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)


def run_generate(args: argparse.Namespace) -> int:
    if (args.prompt is None) == (args.input is None):
        raise ValueError("generate: give either a prompt or --input prompts.jsonl")
    params = sampling_params(args)
    llm = _make_llm(args)
    if args.input:
        _batch(llm, args, params)
    else:
        _stream_one(llm, args.prompt, params)
    return 0


def _user_lines() -> Iterator[str]:
    if not sys.stdin.isatty():
        yield from sys.stdin
        return
    while True:
        try:
            yield input("> ")
        except EOFError:
            return


def run_chat(args: argparse.Namespace) -> int:
    params = sampling_params(args)
    llm = _make_llm(args)
    tokenizer = llm.get_tokenizer()
    messages: list[dict] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    for line in _user_lines():
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line.strip()})
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        reply = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0].outputs[0].text
        print(reply, flush=True)
        messages.append({"role": "assistant", "content": reply})
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lamina", description="lamina: a small, readable LLM inference engine")
    parser.add_argument("--log-level", default="WARNING", help="logging level (default: WARNING)")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text (streams one prompt; --input runs a JSONL batch)")
    gen.add_argument("prompt", nargs="?", help="the prompt text")
    gen.add_argument("--input", help="a JSONL file: one {'prompt': ...} or {'prompt_token_ids': [...]} a line")
    gen.add_argument("--output", help="where to write the JSONL results (default: stdout)")
    _model_args(gen, max_tokens=128)
    gen.set_defaults(func=run_generate)
    chat = sub.add_parser("chat", help="chat with a model through its chat template (reads lines from stdin)")
    chat.add_argument("--system", help="a system message")
    _model_args(chat, max_tokens=256)
    chat.set_defaults(func=run_chat)
    _register_optional(sub)
    return parser


def _register_optional(sub: argparse._SubParsersAction) -> None:
    from lamina.bench.cli import register as register_bench
    from lamina.distill.cli import register as register_distill
    from lamina.server.cli import register as register_serve

    register_serve(sub)
    register_bench(sub)
    register_distill(sub)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"lamina {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
