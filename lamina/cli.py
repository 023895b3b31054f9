"""The `lamina` command: generate, chat, serve, bench, distill, quantize, eval."""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from lamina import DEMO_MODEL, __version__
from lamina.cli_args import add_engine_args, add_sampling_args, engine_kwargs, engine_summary, sampling_params
from lamina.cli_output import format_logprobs, output_row, stream_request
from lamina.jsonl import read_jsonl
from lamina.sampling_params import SamplingParams

if TYPE_CHECKING:  # the engine pulls in torch: import it only when a command runs
    from lamina.llm import LLM

logger = logging.getLogger("lamina.cli")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# A server's log is where its start-up summary belongs; the other commands print their results on stdout.
DEFAULT_LOG_LEVEL = {"serve": "INFO"}


def _model_args(parser: argparse.ArgumentParser, max_tokens: int) -> None:
    parser.add_argument("--model", default=DEMO_MODEL, help="a local HF model directory (default: the demo model)")
    add_engine_args(parser)
    add_sampling_args(parser, {"max_tokens": max_tokens})


def _make_llm(args: argparse.Namespace) -> LLM:
    from lamina.llm import LLM

    llm = LLM(model=args.model, **engine_kwargs(args))
    logger.info("%s", engine_summary(llm.engine))
    return llm


def _read_jsonl(path: str) -> list[dict]:
    rows = []
    for number, row in read_jsonl(path, "--input"):
        if isinstance(row, str):
            row = {"prompt": row}
        if not isinstance(row, dict) or not ("prompt" in row or "prompt_token_ids" in row):
            raise ValueError(f"--input {path}: line {number} needs a 'prompt' or 'prompt_token_ids' field")
        rows.append(row)
    return rows


def _batch(llm: LLM, args: argparse.Namespace, params: SamplingParams) -> None:
    rows = _read_jsonl(args.input)
    prompts = [{k: r[k] for k in ("prompt", "prompt_token_ids") if k in r} for r in rows]
    outputs = llm.generate(prompts, params, use_tqdm=True)
    lines = [json.dumps(output_row(r, o, params.logprobs), ensure_ascii=False) for r, o in zip(rows, outputs)]
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
        return 0
    output = stream_request(llm, args.prompt, params, sys.stdout)
    if params.logprobs is not None:  # after the text, on stderr: stdout stays the generated text
        print(format_logprobs(output.outputs[0], params.logprobs), file=sys.stderr)
    return 0


def run_chat(args: argparse.Namespace) -> int:
    from lamina.cli_chat import chat_loop

    params = sampling_params(args)
    return chat_loop(_make_llm(args), params, args.system)


def _log_level(text: str) -> str:
    level = text.upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return level


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lamina", description="lamina: a small, readable LLM inference engine")
    parser.add_argument("--version", action="version", version=f"lamina {__version__}")
    parser.add_argument("--log-level", type=_log_level, default=None, metavar="LEVEL",
                        help="DEBUG, INFO, WARNING, ERROR (default: INFO for serve, WARNING otherwise); "
                             "also accepted after the subcommand")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text (streams one prompt; --input runs a JSONL batch)")
    gen.add_argument("prompt", nargs="?", help="the prompt text")
    gen.add_argument("--input", help="a JSONL file: one {'prompt': ...} or {'prompt_token_ids': [...]} a line")
    gen.add_argument("--output", help="where to write the JSONL results (default: stdout)")
    _model_args(gen, max_tokens=128)
    gen.set_defaults(func=run_generate)
    chat = sub.add_parser("chat", help="chat with a model through its chat template (reads lines from stdin; "
                                       "replies stream; the oldest turns are dropped when the context is full)")
    chat.add_argument("--system", help="a system message")
    _model_args(chat, max_tokens=256)
    chat.set_defaults(func=run_chat)
    _register_optional(sub)
    _accept_after_subcommands(sub, "--log-level", type=_log_level, metavar="LEVEL",
                              help="logging level (also accepted before the subcommand)")
    return parser


def _register_optional(sub: argparse._SubParsersAction) -> None:
    from lamina.bench.cli import register as register_bench
    from lamina.distill.cli import register as register_distill
    from lamina.quantize.cli import register as register_quant
    from lamina.server.cli import register as register_serve

    register_serve(sub)
    register_bench(sub)
    register_distill(sub)
    register_quant(sub)


def _accept_after_subcommands(sub: argparse._SubParsersAction, flag: str, **kwargs: object) -> None:
    """Add `flag` to every subcommand, nested ones too. Its default is SUPPRESS, so a subcommand that was
    not given the flag leaves the value parsed before the subcommand alone."""
    for parser in set(sub.choices.values()):
        if flag not in parser._option_string_actions:
            parser.add_argument(flag, default=argparse.SUPPRESS, **kwargs)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                _accept_after_subcommands(action, flag, **kwargs)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = args.log_level or DEFAULT_LOG_LEVEL.get(args.command, "WARNING")
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"lamina {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
