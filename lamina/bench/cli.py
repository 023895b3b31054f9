"""`lamina bench serve` (online serving benchmark against any OpenAI-compatible server) and `lamina bench plot`.

httpx (the client) and matplotlib (the plot) are imported only when these commands run, so the `lamina`
command works without them.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path

from .datasets import (DATASETS, DEFAULT_NUM_PROMPTS, DEFAULT_VOCAB_SIZE, PROMPT_FORMATS, DatasetConfig,
                       SampleRequest, ServerLimits, as_prompt_format, fit_to_server, sample_requests)
from .metrics import PointSummary, format_summary, format_sweep, parse_goodput, summarize
from .server_info import ServedModel, served_model

CLIENT_CPU_WARNING = 0.9
SERVE_DESCRIPTION = """\
Measure an OpenAI-compatible server (lamina, vLLM, SGLang, ...) under load, as `vllm bench serve` does:
streaming POST /v1/completions, Poisson arrivals at each --request-rate (inf = all at once), then TTFT,
TPOT, ITL and end-to-end latency (mean, median, percentiles), request and token throughput and, with
--goodput, the rate of requests meeting every SLO. See docs/bench_serve.md.

example:
  lamina bench serve --base-url http://127.0.0.1:8000 --model qwen3-0.6b --dataset w1 \\
      --request-rate 1 2 4 inf --ignore-eos --goodput ttft:500 tpot:50 \\
      --result-file serve.json --plot serve.png
"""


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `lamina bench serve`."""
    a = parser.add_argument
    a("--base-url", default="http://127.0.0.1:8000", help="server root, with or without /v1 (default %(default)s)")
    a("--endpoint", default="/v1/completions", help="completions path (default %(default)s)")
    a("--model", help="model name to send (default: the first id GET /v1/models lists)")
    a("--api-key", help="bearer token (default: $OPENAI_API_KEY, if set)")
    a("--request-rate", nargs="+", type=float, default=[float("inf")], metavar="R",
      help="requests/s, one or more to sweep; inf sends all at once (default inf)")
    a("--num-prompts", type=int, help="requests per rate (default 1000; 256 for --dataset w1)")
    a("--max-concurrency", type=int, help="cap on requests in flight (default: none)")
    a("--burstiness", type=float, default=1.0,
      help="gamma shape of the inter-arrival times: 1 = Poisson, < 1 burstier, > 1 steadier (default 1)")
    a("--seed", type=int, default=0, help="seed of the dataset and of the arrival times (default 0)")
    a("--dataset", choices=DATASETS, default="random",
      help="random (vLLM's) or w1 (BENCHMARKS.md: lengths uniform in [100, 1024]) (default random)")
    a("--random-input-len", type=int, default=1024, help="mean prompt length for random (default 1024)")
    a("--random-output-len", type=int, default=128, help="mean output length for random (default 128)")
    a("--random-range-ratio", type=float, default=0.0,
      help="random lengths are uniform in [L*(1-r), L*(1+r)], r in [0, 1) (default 0)")
    a("--random-vocab-size", type=int,
      help="token ids uniform in [0, V) (default: the served model's vocab_size from GET /v1/models, else 10000)")
    a("--prompt-format", choices=PROMPT_FORMATS, default="ids",
      help="ids: prompts as token-id lists; text: one English word per token, for text-only servers")
    a("--ignore-eos", action="store_true", help="send ignore_eos: true (vLLM's extra field) to force max_tokens")
    a("--temperature", type=float, default=0.0, help="sampling temperature sent (default 0: greedy)")
    a("--extra-body", help="JSON object merged into every request body, e.g. '{\"top_k\": 1}'")
    a("--goodput", nargs="+", metavar="KEY:MS", help="SLOs for goodput, e.g. ttft:500 tpot:50 (keys ttft, tpot, e2el)")
    a("--metric-percentiles", default="50,90,99", help="percentiles to report (default %(default)s)")
    a("--num-warmups", type=int, default=1, help="warm-up requests before the clock (default 1)")
    a("--ready-timeout", type=float, default=0.0, metavar="S",
      help="retry the first warm-up request for up to S seconds while the server starts (default 0)")
    a("--request-timeout", type=float, default=3600.0, metavar="S", help="per-request read timeout (default 3600)")
    a("--result-file", help="write the JSON result (all rates) here")
    a("--save-detailed", action="store_true", help="also write per-request records into the JSON")
    a("--plot", metavar="PNG", help="also write a PNG of latency against request rate (needs matplotlib)")
    a("--label", help="name of this run in the JSON and the plot legend (default: the model name)")
    a("--disable-tqdm", action="store_true", help="no progress bar")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `bench` with its `serve` and `plot` subcommands to the `lamina` command."""
    bench = subparsers.add_parser("bench", help="benchmarks: serve (online serving latency), plot")
    register_commands(bench.add_subparsers(dest="bench_command", required=True))


def register_commands(bench_subparsers: argparse._SubParsersAction) -> None:
    """Add `serve` and `plot` under an existing `bench` parser (for when others add bench commands too)."""
    serve = bench_subparsers.add_parser(
        "serve", help="latency and throughput of an OpenAI-compatible server under load",
        description=SERVE_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_serve_arguments(serve)
    serve.set_defaults(func=run)
    plot = bench_subparsers.add_parser("plot", help="PNG of latency against request rate from serve results")
    plot.add_argument("results", nargs="+", metavar="RESULT.json", help="files written by bench serve --result-file")
    plot.add_argument("--out", required=True, metavar="PNG", help="where to write the PNG")
    plot.set_defaults(func=run_plot)


def _percentiles(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or not all(0 <= v <= 100 for v in values):
        raise ValueError(f"--metric-percentiles must be comma-separated numbers in [0, 100], got {text!r}")
    return values


def _extra_body(text: str | None) -> dict:
    if not text:
        return {}
    try:
        body = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"--extra-body must be a JSON object ({err.msg})") from err
    if not isinstance(body, dict):
        raise ValueError(f"--extra-body must be a JSON object, got {type(body).__name__}")
    return body


def dataset_config(args: argparse.Namespace, limits: ServerLimits | None = None) -> DatasetConfig:
    """The dataset options as a validated :class:`DatasetConfig`; random ids come from the served model's
    vocabulary when `limits` reports it and --random-vocab-size is not given."""
    num = args.num_prompts if args.num_prompts is not None else DEFAULT_NUM_PROMPTS[args.dataset]
    return DatasetConfig(name=args.dataset, num_prompts=num, input_len=args.random_input_len,
                         output_len=args.random_output_len, range_ratio=args.random_range_ratio,
                         vocab_size=_vocab_size(args.random_vocab_size, limits or ServerLimits()),
                         prompt_format=args.prompt_format, seed=args.seed)


def _vocab_size(asked: int | None, limits: ServerLimits) -> int:
    served = limits.vocab_size
    if asked is None:
        return served or DEFAULT_VOCAB_SIZE
    if served is not None and asked > served:
        raise ValueError(f"--random-vocab-size {asked} is larger than the served model's vocabulary "
                         f"({served} token ids, from GET /v1/models): leave it unset to use the model's")
    return asked


def client_config(args: argparse.Namespace) -> tuple[object, ServedModel]:
    """The connection and load options as a validated `ClientConfig`, and the served model (asked from the
    server: the name when --model is absent, and its limits)."""
    from .serve import ClientConfig, api_url

    url = api_url(args.base_url, args.endpoint)
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY")
    served = asyncio.run(served_model(args.base_url, api_key, args.model, args.ready_timeout))
    cfg = ClientConfig(api_url=url, model=served.id, api_key=api_key, ignore_eos=args.ignore_eos,
                       temperature=args.temperature, extra_body=_extra_body(args.extra_body),
                       timeout_s=args.request_timeout, max_concurrency=args.max_concurrency,
                       burstiness=args.burstiness, seed=args.seed, num_warmups=args.num_warmups,
                       ready_timeout_s=args.ready_timeout, disable_tqdm=args.disable_tqdm)
    return cfg, served


def fitted_requests(dataset: DatasetConfig, limits: ServerLimits) -> list[SampleRequest]:
    """The dataset's requests fitted to the server's vocabulary and context; says on stderr what changed."""
    report = fit_to_server(sample_requests(replace(dataset, prompt_format="ids")), limits)
    notes = report.notes(limits)
    if limits.max_model_len is None:
        notes.append("the server does not report max_model_len (GET /v1/models): lengths are not fitted to it")
    for note in notes:
        print(f"lamina bench serve: note: {note}", file=sys.stderr)
    return as_prompt_format(report.requests, dataset.prompt_format)


def result_json(args: argparse.Namespace, cfg: object, dataset: DatasetConfig, slos: dict[str, float],
                percentiles: tuple[float, ...], summaries: list[PointSummary], runs: list,
                limits: ServerLimits | None = None) -> dict:
    """The result file: the setup once, then one flat vLLM-style dict per request rate."""
    from lamina import __version__

    points = [{**s.to_json(), "client_cpu_util": r.client_cpu_util} for s, r in zip(summaries, runs)]
    if args.save_detailed:
        for point, run_result in zip(points, runs):
            point["requests"] = [asdict(r) for r in run_result.records]
    return {"benchmark": "lamina bench serve", "lamina_version": __version__,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "label": args.label or cfg.model, "base_url": args.base_url, "api_url": cfg.api_url,
            "model": cfg.model, "server_limits": asdict(limits or ServerLimits()), "dataset": asdict(dataset),
            "ignore_eos": cfg.ignore_eos, "temperature": cfg.temperature, "extra_body": cfg.extra_body,
            "max_concurrency": cfg.max_concurrency,
            "burstiness": cfg.burstiness, "seed": cfg.seed, "goodput_slos_ms": slos,
            "percentiles": list(percentiles), "points": points}


def run(args: argparse.Namespace) -> int:
    """`lamina bench serve`: run every rate, print vLLM's tables, write the JSON and the plot if asked."""
    from .serve import benchmark

    if args.plot and not args.result_file:
        raise ValueError("--plot draws from the JSON result: give --result-file too")
    dataset_config(args)  # validate the dataset options before asking the server anything
    slos = parse_goodput(args.goodput)
    percentiles = _percentiles(args.metric_percentiles)
    cfg, served = client_config(args)
    dataset = dataset_config(args, served.limits)
    requests = fitted_requests(dataset, served.limits)
    print(f"lamina bench serve: {len(requests)} requests ({dataset.name}) to {cfg.api_url}, model {cfg.model}, "
          f"rates {' '.join(f'{r:g}' for r in args.request_rate)}", flush=True)
    runs = benchmark(cfg, requests, list(args.request_rate))
    summaries = [summarize(r.records, r.duration_s, r.request_rate, cfg.max_concurrency, slos, percentiles)
                 for r in runs]
    for summary, run_result in zip(summaries, runs):
        print(format_summary(summary))
        if run_result.client_cpu_util > CLIENT_CPU_WARNING:
            print(f"warning: the client used {run_result.client_cpu_util:.0%} of a core at rate "
                  f"{run_result.request_rate:g}: it was the bottleneck, and its queueing is in the latencies",
                  file=sys.stderr)
    if len(summaries) > 1:
        print(format_sweep(summaries))
    if args.result_file:
        result = result_json(args, cfg, dataset, slos, percentiles, summaries, runs, served.limits)
        Path(args.result_file).parent.mkdir(parents=True, exist_ok=True)
        Path(args.result_file).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.result_file}")
    if args.plot and _plot([args.result_file], args.plot) != 0:
        return 1
    if any(s.completed == 0 for s in summaries):
        print("lamina bench serve: every request failed at some rate (see the errors above)", file=sys.stderr)
        return 1
    return 0


def _plot(paths: list[str], out: str) -> int:
    from .plot import plot_results

    try:
        plot_results(paths, out)
    except ImportError as err:
        print(f"lamina bench: error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


def run_plot(args: argparse.Namespace) -> int:
    """`lamina bench plot`: one PNG from one or more serve result files."""
    return _plot(args.results, args.out)
