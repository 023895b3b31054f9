"""W4 with its peer in one run: `lamina serve` and HF `transformers serve --continuous-batching` on the same
random-weight checkpoint, the same W1-shaped text prompts, Poisson arrivals; then lamina at ~3x capacity
with a small --max-queue (429s, admitted requests' latency bounded). Issue #10.

    python scripts/w4_peer.py --out DIR                 # H200: Qwen3-0.6B shape, bf16 (~4 min)
    python scripts/w4_peer.py --out DIR --dry-run       # CPU: tiny shape, few short requests

The checkpoint: the shape's config, random bf16 weights saved by transformers, and a word-level tokenizer in
which each of `lamina bench serve`'s prompt words is one token (the rest of the vocabulary is filler), so a
text prompt of N words is N tokens for both servers. No EOS: every request runs to its max_tokens (HF's
server rejects `ignore_eos`). Prints a table last; writes w4-peer.json into --out.

The H200's image has neither lamina's server packages nor HF serve's: carry them as cp312 wheels (.whl, as
the device tool's README says): fastapi starlette uvicorn h11 click prometheus_client pydantic pydantic_core
typing-inspection annotated-types annotated-doc opentelemetry-api httpx httpcore anyio sniffio idna certifi
typing_extensions openai jiter httpx2 httpcore2 truststore (versions as installed here on 2026-12-01).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lamina.bench.datasets import _WORDS  # noqa: E402
from lamina.bench.offline import write_config  # noqa: E402
from lamina.bench.w4_sweep import Server, free_port  # noqa: E402


def make_checkpoint(shape: str, directory: Path, device: str) -> Path:
    """config.json + random bf16 safetensors (transformers) + a word-level tokenizer, in `directory`."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    config_path = write_config(shape, directory)
    config = AutoConfig.from_pretrained(directory)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(directory)
    words = list(dict.fromkeys(_WORDS))
    vocab = {w: i for i, w in enumerate(words)} | {f"<filler{i}>": i for i in range(len(words), config.vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=words[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": config.max_position_embeddings}))
    return config_path.parent


def bench(url: str, model: str, rates: list[float], num_prompts: int, out: Path, label: str,
          temperature: float) -> dict:
    """`lamina bench serve` against `url`: W1 prompts as text, one result file per call."""
    result = out / f"{label}.json"
    cmd = [sys.executable, "-m", "lamina.cli", "bench", "serve", "--base-url", url, "--model", model,
           "--dataset", "w1", "--prompt-format", "text", "--num-prompts", str(num_prompts),
           "--request-rate", *[str(r) for r in rates], "--temperature", str(temperature), "--label", label,
           "--result-file", str(result), "--ready-timeout", "60", "--disable-tqdm", "--goodput", "ttft:500", "tpot:50"]
    subprocess.run(cmd, check=True, timeout=900)
    return json.loads(result.read_text())


def serve(cmd: list[str], port: int, log: Path, timeout_s: float) -> Server:
    server = Server(cmd, port, log)
    server.wait_healthy(timeout_s)
    return server


def run_server(name: str, cmd: list[str], port: int, args: argparse.Namespace, rates: list[float],
               num_prompts: int, model_name: str) -> dict:
    start = time.perf_counter()
    server = serve(cmd, port, args.out / f"{name}.log", args.server_timeout)
    ready_s = time.perf_counter() - start
    try:
        report = bench(server.url, model_name, rates, num_prompts, args.out, name, args.temperature)
    finally:
        server.stop()
    return {"name": name, "startup_s": round(ready_s, 1), "report": report}


def lamina_cmd(model: Path, port: int, args: argparse.Namespace, *flags: str) -> list[str]:
    cmd = [sys.executable, "-m", "lamina.cli", "serve", str(model), "--port", str(port),
           "--served-model-name", args.model_name, "--uvicorn-log-level", "warning", *flags]
    return cmd + (["--device", "cpu", "--max-model-len", "1100"] if args.dry_run else [])


def hf_cmd(model: Path, port: int, args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "transformers.cli.transformers", "serve", str(model), "--port", str(port),
            "--continuous-batching",
            "--device", "cpu" if args.dry_run else "cuda", "--dtype", "bfloat16"]


def rows(runs: list[dict]) -> list[str]:
    lines = ["server | rate | ok/failed | output tok/s | TTFT mean / p50 / p99 ms | TPOT mean / p99 ms | ITL p99 ms"]
    for run in runs:
        for point in run["report"]["points"]:
            lines.append(
                f"{run['name']} | {point['request_rate']} | {point['completed']}/{point['failed']} | "
                f"{point['output_throughput']:.0f} | {point['mean_ttft_ms']:.0f} / {point['p50_ttft_ms']:.0f} / "
                f"{point['p99_ttft_ms']:.0f} | {point['mean_tpot_ms']:.1f} / {point['p99_tpot_ms']:.1f} | "
                f"{point['p99_itl_ms']:.0f}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--shape", default="qwen3-0.6b")
    parser.add_argument("--rates", nargs="+", type=float, default=[1.0, 4.0])
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--overload-rate", type=float, default=60.0)
    parser.add_argument("--overload-prompts", type=int, default=300)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--server-timeout", type=float, default=300.0)
    parser.add_argument("--skip-peer", action="store_true")
    args = parser.parse_args()
    args.model_name = "w4-model"
    if args.dry_run:
        args.shape, args.rates, args.num_prompts, args.overload_rate, args.overload_prompts = "tiny", [4.0], 3, 50, 12
    args.out.mkdir(parents=True, exist_ok=True)
    model = make_checkpoint(args.shape, args.out / "model", "cpu" if args.dry_run else "cuda")
    runs = [run_server("lamina", lamina_cmd(model, port := free_port(), args), port, args, args.rates,
                       args.num_prompts, args.model_name)]
    if not args.skip_peer:  # HF's server is pinned to the model's path: that is its model name
        runs.append(run_server("hf-transformers-serve-cb", hf_cmd(model, port := free_port(), args), port, args,
                               args.rates, args.num_prompts, str(model)))
    overload = lamina_cmd(model, port := free_port(), args, "--max-num-seqs", "64", "--max-queue", "16")
    runs.append(run_server("lamina-overload-64seqs-queue16", overload, port, args, [args.overload_rate],
                           args.overload_prompts, args.model_name))
    (args.out / "w4-peer.json").write_text(json.dumps({"shape": args.shape, "runs": runs}, indent=1))
    print("\n".join(rows(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
