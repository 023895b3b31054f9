"""A client that disconnects in every phase of its request (issue 10): queued (no slot), prefilling (a
chunked prompt half-way), decoding (tokens generated, none or some read), streamed or not, completions and
chat. The StepGate holds the engine loop so that each disconnect lands in its phase deterministically; each
test ends with the request counted as aborted, check_integrity(), /health 200 and the gauges at 0."""
from __future__ import annotations

import json
import socket
import threading
from urllib.parse import urlsplit

import httpx
import pytest

from tests.server.harness import MODEL_NAME, RunningServer, make_engine, scrape, start_server, wait_until

ABORTS = 'lamina:request_success_total{finished_reason="abort"}'
SHORT = list(range(1, 5))  # one prefill step (max_num_batched_tokens 8)
LONG = list(range(1, 31))  # four prefill chunks of 8 tokens
CHAT = {"messages": [{"role": "user", "content": "hi"}]}
BODY = {"model": MODEL_NAME, "max_tokens": 50, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def gated(model_dir: str) -> RunningServer:
    """One sequence slot and 8 tokens a step: a second request queues, a long prompt prefills in chunks."""
    running = start_server(make_engine(model_dir, max_num_seqs=1, max_num_batched_tokens=8), max_n=4)
    yield running
    running.engine.check_integrity()
    running.stop()


@pytest.fixture(autouse=True)
def _resume(gated: RunningServer) -> None:
    yield
    gated.gate.resume()  # a failed test must not leave the engine held for the next one


class RawRequest:
    """An HTTP/1.1 POST over a plain socket, so that the test decides the exact moment the client leaves."""

    def __init__(self, server: RunningServer, path: str, body: dict) -> None:
        url = urlsplit(server.url)
        data = json.dumps(body).encode()
        head = (f"POST /v1{path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n")
        self.sock = socket.create_connection((url.hostname, url.port), timeout=30)
        self.sock.sendall(head.encode() + data)
        self.received = b""

    def read_events(self, count: int) -> None:
        """Read until `count` SSE data events have arrived."""
        while self.received.count(b"data: ") < count:
            chunk = self.sock.recv(65536)
            assert chunk, f"the server closed the stream: {self.received!r}"
            self.received += chunk

    def disconnect(self) -> None:
        self.sock.close()


def hold_the_slot(server: RunningServer) -> tuple[threading.Thread, list[str]]:
    """A streamed request that takes the one sequence slot; the thread reads it to its end."""
    lines: list[str] = []

    def run() -> None:
        body = {**BODY, "prompt": SHORT, "stream": True}
        with httpx.stream("POST", server.base_url + "/completions", json=body, timeout=60) as r:
            lines.extend(line for line in r.iter_lines() if line)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, lines


def settle(server: RunningServer, aborts_before: float) -> None:
    wait_until(lambda: server.engine.num_inflight_seqs == 0, what="requests to finish")
    wait_until(lambda: scrape(server.url).get(ABORTS, 0.0) == aborts_before + 1, what="the abort to be counted")
    wait_until(lambda: (lambda m: m["lamina:num_requests_running"] == m["lamina:num_requests_waiting"] == 0
                        and m["lamina:kv_cache_usage_perc"] == 0.0)(scrape(server.url)),
               what="the gauges to reach 0")
    server.engine.check_integrity()
    assert httpx.get(server.url + "/health").status_code == 200


def steps(server: RunningServer) -> int:
    return server.engine.get_stats().num_steps


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/completions", "/chat/completions"])
def test_disconnect_while_queued(gated: RunningServer, stream: bool, path: str) -> None:
    aborts, start = scrape(gated.url).get(ABORTS, 0.0), steps(gated)
    gated.gate.pause_after(2)
    holder, lines = hold_the_slot(gated)
    wait_until(lambda: steps(gated) == start + 2, what="the holder's prefill and first decode")
    prompt = CHAT if path.startswith("/chat") else {"prompt": SHORT}
    victim = RawRequest(gated, path, {**BODY, **prompt, "stream": stream, "n": 2})
    wait_until(lambda: gated.engine.num_inflight_seqs == 3, what="the victim to be submitted")
    gated.gate.pause_after(2)  # the engine takes the victim in, and cannot schedule it: one slot
    wait_until(lambda: gated.engine.get_stats().num_waiting == 2, what="the victim's 2 samples to wait")
    assert gated.engine.get_stats().num_running == 1
    victim.disconnect()
    wait_until(lambda: gated.engine.num_inflight_seqs == 1, what="the server to notice the disconnect")
    gated.gate.resume()
    holder.join(60)
    assert lines[-1] == "data: [DONE]" and not any('"error"' in line for line in lines)
    settle(gated, aborts)


@pytest.mark.parametrize("stream", [False, True])
def test_disconnect_while_prefilling(gated: RunningServer, stream: bool) -> None:
    aborts, start = scrape(gated.url).get(ABORTS, 0.0), steps(gated)
    gated.gate.pause_after(1)  # one 8-token chunk of a 30-token prompt
    victim = RawRequest(gated, "/completions", {**BODY, "prompt": LONG, "stream": stream})
    wait_until(lambda: steps(gated) == start + 1, what="the first prefill chunk")
    stats = gated.engine.get_stats()
    assert stats.num_running == 1 and stats.kv_usage > 0
    assert b"data: " not in victim.received  # no token yet
    victim.disconnect()
    wait_until(lambda: gated.engine.num_inflight_seqs == 0, what="the server to notice the disconnect")
    gated.gate.resume()
    settle(gated, aborts)


def prefill_steps(server: RunningServer, chat: bool) -> int:
    """Engine steps the prompt takes to prefill (8 tokens a step)."""
    if not chat:
        return 1
    tokenizer = server.engine.tokenizer
    text = tokenizer.apply_chat_template(CHAT["messages"], True)
    return -(-len(tokenizer.encode(text, add_special_tokens=False)) // 8)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/completions", "/chat/completions"])
def test_disconnect_while_decoding(gated: RunningServer, stream: bool, path: str) -> None:
    aborts, start = scrape(gated.url).get(ABORTS, 0.0), steps(gated)
    chat = path.startswith("/chat")
    held = prefill_steps(gated, chat) + 3  # the prefill, three decode steps, then the engine holds
    assert held + 1 < BODY["max_tokens"]  # so the request cannot finish on its own
    gated.gate.pause_after(held)
    victim = RawRequest(gated, path, {**BODY, **(CHAT if chat else {"prompt": SHORT}), "stream": stream})
    wait_until(lambda: steps(gated) == start + held, what="the decode steps")
    assert gated.engine.get_stats().kv_usage > 0
    if stream:
        victim.read_events(1)  # the stream has started (a token, or chat's role delta): the client reads it
    victim.disconnect()
    wait_until(lambda: gated.engine.num_inflight_seqs == 0, what="the server to notice the disconnect")
    gated.gate.resume()
    settle(gated, aborts)
