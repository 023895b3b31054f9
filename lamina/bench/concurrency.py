"""Throughput at a fixed concurrency: a closed loop of requests over one engine.

`concurrency` requests run at once; each one that ends is replaced by the next from a queue, as a server under
constant load (or an offline job far larger than its batch) sees it. The clock runs from the first step until the
queue runs dry (the last request is added): over that span the batch is always full, and what is measured is the
engine's steady rate at that batch size, without the tail where the last requests finish with few rows beside
them. (B prompts submitted together and waited for all measure that tail too: with speculation the requests
finish at different steps, and the last ones then run with an emptying batch.)

    requests:  r0 .. r(B-1) added    |  each end adds the next  ...  the queue is dry  |  still running: aborted
    clock:                           start ------------------------------------------ stop
    tokens:    the outputs of the requests that ended, plus what the aborted ones had emitted by then
"""
from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Sequence

from lamina.engine.engine import LLMEngine
from lamina.sampling_params import RequestOutputKind, SamplingParams


def closed_loop_requests(prompts: Sequence[str], count: int, new_tokens: int, temperature: float,
                         seed: int = 0) -> list[tuple[str, SamplingParams]]:
    """`count` requests over `prompts` in turn, output lengths uniform in [new_tokens / 2, 3 * new_tokens / 2]
    (drawn from `seed`: every engine gets the same list), `ignore_eos`, request i sampled with seed i (the same
    text with and without drafts, so engines compare on the same tokens)."""
    rng = random.Random(seed)
    return [(prompts[i % len(prompts)],
             SamplingParams(temperature=temperature, ignore_eos=True, seed=i,
                            max_tokens=rng.randint(max(1, new_tokens // 2), 3 * new_tokens // 2),
                            output_kind=RequestOutputKind.FINAL_ONLY))
            for i in range(count)]


def steady_throughput(engine: LLMEngine, requests: Sequence[tuple[str, SamplingParams]],
                      concurrency: int) -> tuple[int, float]:
    """(tokens, seconds) of the closed loop at `concurrency` over `requests` (the module docstring); the engine
    is left empty."""
    if not 1 <= concurrency < len(requests):
        raise ValueError(f"concurrency: must be in [1, {len(requests) - 1}] for {len(requests)} requests, "
                         f"got {concurrency}")
    queue = deque(requests)
    in_flight = {engine.add_request(*queue.popleft()) for _ in range(concurrency)}
    tokens, start = 0, time.perf_counter()
    while queue:
        for output in engine.step():
            if output.finished:
                in_flight.discard(output.request_id)
                tokens += len(output.outputs[0].token_ids)
                if queue:
                    in_flight.add(engine.add_request(*queue.popleft()))
    seconds = time.perf_counter() - start
    for request_id in in_flight:
        output = engine.abort_request(request_id)
        tokens += len(output.outputs[0].token_ids) if output is not None else 0
    return tokens, seconds
