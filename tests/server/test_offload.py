"""Nothing heavy on the event loop (issue 10, reproducer 3): a prompt of megabytes is refused at once when its
bytes cannot fit max_model_len tokens, and is otherwise tokenized on a worker thread while /health answers."""
from __future__ import annotations

import math
import random
import threading
import time

import httpx
import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import models, normalizers, pre_tokenizers

from lamina import DEMO_MODEL
from lamina.loader.token_bytes import max_bytes_per_token, utf8_len
from lamina.loader.tokenizer import Tokenizer
from tests.server.harness import MODEL_NAME, RunningServer, make_engine, start_server

BIG = 3_900_000  # bytes of prompt: under the 4 MiB body limit (the reproducer)
HEALTH_BOUND_S = 0.5  # the goal is 100 ms; generous for a loaded 2-core machine


@pytest.fixture(scope="module")
def big_server(model_dir: str) -> RunningServer:
    running = start_server(make_engine(model_dir), max_body_bytes=4 << 20)
    yield running
    running.engine.check_integrity()
    running.stop()


def _texts() -> list[str]:
    rng = random.Random(0)
    alphabet = "ab ,.\n\t  é日本語🙂" + "".join(chr(c) for c in range(0x20, 0x7f))
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 400))) for _ in range(100)]
    return texts + [" " * 1000, "\n" * 700, "a" * 3000, "<|endoftext|>" * 20, "日本" * 300]


@pytest.mark.parametrize("source", ["demo", "tiny"])
def test_a_token_never_covers_more_bytes_than_the_bound(source: str, model_dir: str) -> None:
    tokenizer = Tokenizer.from_pretrained(DEMO_MODEL if source == "demo" else model_dir)
    per_token = tokenizer.max_bytes_per_token
    assert per_token is not None and per_token >= 4
    for text in _texts():
        assert len(tokenizer.encode(text, add_special_tokens=False)) >= math.ceil(utf8_len(text) / per_token)


def test_no_bound_for_a_tokenizer_that_can_shrink_its_input() -> None:
    wordpiece = BackendTokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    wordpiece.pre_tokenizer = pre_tokenizers.Whitespace()
    assert max_bytes_per_token(wordpiece) is None
    nfc = BackendTokenizer(models.BPE())
    nfc.normalizer = normalizers.NFC()
    assert max_bytes_per_token(nfc) is None
    spaces = BackendTokenizer(models.BPE())
    spaces.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    assert max_bytes_per_token(spaces) is None


def test_a_long_encode_lets_other_threads_run() -> None:
    tokenizer = Tokenizer.from_pretrained(DEMO_MODEL)
    text = "hello world, this is a test. " * 20_000  # 580 kB: about half a second of tokenizing
    expected = tokenizer._backend.encode(text).ids
    result: list[list[int]] = []
    worker = threading.Thread(target=lambda: result.append(tokenizer.encode(text)))
    worst, last = 0.0, time.perf_counter()
    worker.start()
    while worker.is_alive():
        time.sleep(0.005)
        now = time.perf_counter()
        worst, last = max(worst, now - last), now
    assert result == [expected]
    assert worst < HEALTH_BOUND_S, f"the main thread was held for {worst:.3f} s"


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_a_prompt_too_long_for_the_context_is_refused_before_tokenizing(big_server: RunningServer,
                                                                         endpoint: str) -> None:
    text = "hello world " * (BIG // 12)
    if endpoint == "chat":
        path, body = "/chat/completions", {"messages": [{"role": "user", "content": text}]}
    else:
        path, body = "/completions", {"prompt": text}
    start = time.perf_counter()
    response = httpx.post(big_server.base_url + path, json={"model": MODEL_NAME, "max_tokens": 4, **body},
                          timeout=60)
    elapsed = time.perf_counter() - start
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and "bytes" in error["message"]
    assert error["param"] == ("messages" if endpoint == "chat" else "prompt")
    assert elapsed < 1.0, f"{elapsed:.3f} s to refuse a prompt that cannot fit"


def test_health_answers_while_a_huge_prompt_is_tokenized(big_server: RunningServer) -> None:
    """A tokenizer without a byte bound (as WordPiece): the 3.9 MB prompt is really tokenized (seconds), on a
    worker thread, while a concurrent client sees /health answer quickly."""
    tokenizer = big_server.engine.tokenizer
    tokenizer.__dict__["max_bytes_per_token"] = None  # the cached bound, switched off for this test
    latencies: list[float] = []
    done = threading.Event()

    def poll_health() -> None:
        with httpx.Client(timeout=30) as client:
            while not done.is_set():
                start = time.perf_counter()
                assert client.get(big_server.url + "/health").status_code == 200
                latencies.append(time.perf_counter() - start)
                time.sleep(0.02)

    poller = threading.Thread(target=poll_health, daemon=True)
    poller.start()
    try:
        start = time.perf_counter()
        response = httpx.post(big_server.base_url + "/completions",
                              json={"model": MODEL_NAME, "prompt": "hello world " * (BIG // 12), "max_tokens": 4},
                              timeout=120)
        tokenizing = time.perf_counter() - start
    finally:
        done.set()
        poller.join(timeout=30)
        del tokenizer.__dict__["max_bytes_per_token"]
    assert response.status_code == 400 and "max_model_len" in response.json()["error"]["message"]
    assert len(latencies) >= 5, f"only {len(latencies)} /health calls in {tokenizing:.2f} s"
    worst = max(latencies)
    print(f"\n/health while tokenizing {BIG:,} bytes for {tokenizing:.2f} s: {len(latencies)} calls, "
          f"median {sorted(latencies)[len(latencies) // 2] * 1e3:.1f} ms, worst {worst * 1e3:.1f} ms")
    assert worst < HEALTH_BOUND_S, f"/health took {worst:.3f} s while a prompt was tokenized"
