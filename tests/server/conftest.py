"""Fixtures: one tiny Llama with a real tokenizer per session; a real server per test module."""
from __future__ import annotations

import openai
import pytest

from lamina import LLM
from tests.helpers.tiny_models import make_tiny_model
from tests.helpers.tiny_tokenizer import save_tiny_tokenizer
from tests.server.harness import ENGINE_KWARGS, RunningServer, make_engine, start_server


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = make_tiny_model("llama", tmp_path_factory.mktemp("served"), vocab_size=320)
    save_tiny_tokenizer(path, vocab_size=300)
    return str(path)


@pytest.fixture(scope="session")
def offline(model_dir: str) -> LLM:
    """The offline API on the same model and engine settings: the oracle for server outputs."""
    return LLM(model=model_dir, **ENGINE_KWARGS)


@pytest.fixture(scope="module")
def server(model_dir: str) -> RunningServer:
    running = start_server(make_engine(model_dir), max_n=4, max_body_bytes=64 * 1024)
    yield running
    running.engine.check_integrity()
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    with openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=30) as c:
        yield c
