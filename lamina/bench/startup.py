"""Start-up time: `LLM(...)` (load, KV sizing, kernel warm-up, CUDA graphs) and the first token after it.

    TRITON_CACHE_DIR=$(mktemp -d) python -m lamina.bench.startup --shape qwen3-0.6b   # cold: empty cache
    python -m lamina.bench.startup --shape qwen3-0.6b                                   # warm: cache reused

Whether a run is cold is up to the caller's Triton cache directory; the result says which it was (the
cache's file count before the run). Dummy bf16 weights, engine defaults. Logs the engine's start-up stages,
prints one line, writes JSON.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

T0 = time.perf_counter()  # before torch and lamina are imported

from lamina import LLM, SamplingParams  # noqa: E402
from lamina.bench.offline import SHAPES, write_config  # noqa: E402


def triton_cache_files() -> int:
    cache = Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))
    return sum(1 for _ in cache.rglob("*")) if cache.exists() else 0


def measure(shape: str, device: str) -> dict:
    cached_files = triton_cache_files()
    imported = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir:
        config = write_config(shape, workdir)
        llm = LLM(model=str(config), load_format="dummy", skip_tokenizer_init=True, device=device)
        ready = time.perf_counter()
        llm.generate([{"prompt_token_ids": list(range(16))}], SamplingParams(temperature=0, max_tokens=1),
                     use_tqdm=False)
        first = time.perf_counter()
    return dict(shape=shape, cold=cached_files == 0, triton_cache_files_before=cached_files,
                import_s=round(imported - T0, 2), engine_s=round(ready - imported, 2),
                first_token_s=round(first - ready, 3), total_s=round(first - T0, 2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-0.6b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--result-file", default=None)
    args = parser.parse_args(argv)
    # the engine logs each start-up stage's time (load, KV sizing, kernel warm-up, CUDA graphs) at INFO
    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)6.0f ms %(name)s: %(message)s")
    result = measure(args.shape, args.device)
    if args.result_file:
        Path(args.result_file).write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
