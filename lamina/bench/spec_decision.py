"""The host time of one adaptive n-gram decision (lamina.engine.drafts.propose_drafts with the policy) at n
running requests: what speculation costs a step on the host, whether or not anybody drafts.

    python -m lamina.bench.spec_decision [--batch-sizes 1,8,32,128,256] [--steps 60] [--result-file out.json]

Synthetic decoding requests (a 60-token prompt, 100 output tokens, random ids from 4,000: few n-gram matches, as
at temperature 0.6), each gaining one token a step; a cost model seeded with step times like the demo model's on
the H200 under CUDA graphs (the policy's uniform-depth path). The median over the steps after the first 10.
No model, no device: it times the host alone.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from lamina.bench.cpu_report import run_info, write_report
from lamina.engine.drafts import SpecDecodeStats, TokenArrays, propose_drafts
from lamina.engine.request import Request, RequestStatus
from lamina.engine.spec_policy import SpecPolicy
from lamina.engine.step_cost import StepCostModel
from lamina.sampling_params import SamplingParams
from lamina.spec.ngram import NgramProposer

K = 7  # the n-gram default
STEP_SECONDS = [(1, 4e-4), (8, 5e-4), (32, 9e-4), (128, 2e-3), (256, 2.3e-3), (1024, 2.8e-3), (2048, 4e-3)]
VERIFY_QUERY_LENS = tuple(range(1, K + 2))


def decoding_requests(n: int, rng: np.random.Generator) -> list[Request]:
    requests = []
    for i in range(n):
        request = Request(str(i), rng.integers(0, 4000, 60).tolist(), SamplingParams(temperature=0.6, max_tokens=256))
        request.append_output_token_ids(rng.integers(0, 4000, 100).tolist())
        request.num_computed_tokens, request.status = request.num_tokens - 1, RequestStatus.RUNNING
        requests.append(request)
    return requests


def decision_seconds(n: int, steps: int, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    requests = decoding_requests(n, rng)
    cost = StepCostModel()
    cost.seed(STEP_SECONDS)
    policy = SpecPolicy(cost, graph_query_lens=VERIFY_QUERY_LENS, graph_max_rows=512, max_step_tokens=8192)
    proposer, arrays, stats = NgramProposer(K, 1, 4), TokenArrays(), SpecDecodeStats()
    times = []
    for _ in range(steps):
        for request in requests:
            request.append_output_token_ids([int(rng.integers(0, 4000))])
            request.num_computed_tokens = request.num_tokens - 1
        start = time.perf_counter()
        propose_drafts(proposer, requests, K, 4096, arrays, policy, stats)
        times.append(time.perf_counter() - start)
    return float(np.median(times[10:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", default="1,8,32,128,256")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--result-file")
    args = parser.parse_args()
    if args.steps <= 10:
        parser.error(f"--steps must be > 10 (the first 10 are warm-up), got {args.steps}")
    rows = []
    for n in (int(b) for b in args.batch_sizes.split(",")):
        seconds = decision_seconds(n, args.steps)
        rows.append({"batch_size": n, "decision_ms": 1e3 * seconds, "us_per_request": 1e6 * seconds / n})
        print(f"batch {n:4d}: decision {1e3 * seconds:.3f} ms ({1e6 * seconds / n:.1f} us a request)", flush=True)
    write_report(args.result_file, {"workload": "n-gram decision host time", **run_info(), "results": rows})


if __name__ == "__main__":
    main()
