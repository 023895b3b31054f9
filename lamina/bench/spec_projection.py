"""What speculation would buy on a large target: the measured cost of a batch-1 verify step of 1 + k tokens
against a decode step of 1 token, on dummy weights of a real shape, turned into speed-ups by arithmetic.

    python -m lamina.bench.spec_projection [--shape llama3-8b] [--k 3] [--context 512]
                                           [--acceptance ngram=0.6,draft_model=0.7] [--result-file out.json]

Each step is the engine's own forward (a replayed CUDA graph on a GPU: q = 1 and q = 1 + k are both captured
when drafting) plus the LM head over its logits rows, timed with CUDA events (wall time on CPU) over many
repeats. With a per-draft acceptance rate a, a verify of k drafts yields E = (1 - a^(k+1)) / (1 - a) tokens, so

    speed-up = E * t(1) / (t(1 + k) + t_draft)

t_draft: 0 for n-gram (host, overlapped); for an EAGLE-style head, k forwards of one decoder layer of the target,
estimated as k * t(1) / num_layers (the head is one layer of the same width, the LM head shared).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch

from lamina import LLM
from lamina.bench.cpu_report import run_info, write_report
from lamina.bench.offline import SHAPES, write_config
from lamina.worker.input_batch import HostBatch


def verify_batch(context: int, q: int, block_size: int) -> HostBatch:
    """One request with `context` tokens cached, computing q more (blocks 1, 2, ...); it samples nothing (no
    request of that id is held: a graph copies its argmax, as for greedy rows)."""
    blocks = list(range(1, -(-(context + q) // block_size) + 1))
    positions = list(range(context, context + q))
    slots = [blocks[p // block_size] * block_size + p % block_size for p in positions]
    return HostBatch(input_ids=[1] * q, positions=positions, slot_mapping=slots, query_start_loc=[0, q],
                     seq_lens=[context + q], block_tables=[blocks], logits_indices=list(range(q)),
                     sampling_req_ids=[], sample_positions=[], num_draft_tokens=[])


@torch.inference_mode()
def step_ms(llm: LLM, batch: HostBatch, repeats: int) -> float:
    """Mean ms of the forward (graph replay when captured) and the LM head of `batch`."""
    worker = llm.engine.executor.worker
    runner, cuda = worker.runner, worker.device.type == "cuda"

    def step() -> None:
        out = runner._forward(batch, None)
        if out.logits is None:  # a captured graph computes the logits of small batches itself
            runner.model.compute_logits(out.hidden)
    for _ in range(5):
        step()
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / repeats
    begin = time.perf_counter()
    for _ in range(repeats):
        step()
    return 1000 * (time.perf_counter() - begin) / repeats


def expected_tokens(acceptance: float, k: int) -> float:
    return k + 1 if acceptance >= 1 else (1 - acceptance ** (k + 1)) / (1 - acceptance)


def run(shape: str, k: int, context: int, acceptance: dict[str, float], repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as workdir:
        write_config(shape, workdir)
        spec = {"method": "ngram", "num_speculative_tokens": k, "adaptive": False}  # captures the q = 1 + k graphs
        llm = LLM(model=workdir, load_format="dummy", skip_tokenizer_init=True, speculative_config=spec,
                  max_model_len=context + 64, max_num_seqs=8, kv_cache_memory_bytes=2 << 30)
    block_size = llm.engine.config.cache_config.block_size
    plain = step_ms(llm, verify_batch(context, 1, block_size), repeats)
    verify = step_ms(llm, verify_batch(context, k + 1, block_size), repeats)
    layers = SHAPES[shape]["num_hidden_layers"]
    rows = []
    for name, a in acceptance.items():
        tokens = expected_tokens(a, k)
        rows.append({"method": name, "acceptance": a, "tokens_per_verify": tokens,
                     "speedup_free_drafts": tokens * plain / verify,
                     "speedup_eagle_head": tokens * plain / (verify + k * plain / layers)})
    return {"shape": shape, "k": k, "context": context, "decode_ms": plain, "verify_ms": verify,
            "verify_over_decode": verify / plain, **run_info(), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--acceptance", default="0.5,0.6,0.7,0.8",
                        help="per-draft acceptance rates to project: NAME=RATE or RATE, comma-separated")
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--result-file")
    args = parser.parse_args(argv)
    acceptance = {}
    for item in args.acceptance.split(","):
        name, _, rate = item.rpartition("=")
        acceptance[name or f"a={rate}"] = float(rate)
    report = run(args.shape, args.k, args.context, acceptance, args.repeats)
    print(f"{report['shape']}, batch 1, context {report['context']}: decode {report['decode_ms']:.3f} ms, "
          f"verify of {report['k'] + 1} tokens {report['verify_ms']:.3f} ms ({report['verify_over_decode']:.2f}x)")
    print("acceptance  tokens/verify  speed-up (free drafts)  speed-up (EAGLE-style head)")
    for r in report["rows"]:
        print(f"{r['method']:>10s} {r['tokens_per_verify']:14.2f} {r['speedup_free_drafts']:23.2f}x "
              f"{r['speedup_eagle_head']:27.2f}x")
    write_report(args.result_file, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
