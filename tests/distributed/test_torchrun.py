"""Several nodes, simulated: two `torchrun --nnodes 2` launches on localhost (c10d rendezvous), each running
`python -m lamina.launch generate ...`; the rank-0 process writes the same tokens as TP=1."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from lamina import LLM, SamplingParams
from tests.helpers.tiny_models import make_tiny_model

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [[3, 14, 15, 92, 65, 35], [8, 9, 7], list(range(40, 61))]
MAX_NEW = 6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(node_rank: int, port: int, model: str, tmp: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
               "--node-rank", str(node_rank), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
               "--rdzv-id", "lamina-test", "--max-restarts", "0",
               "-m", "lamina.launch", "generate", "--model", model, "--skip-tokenizer-init",
               "--input", str(tmp / "in.jsonl"), "--output", str(tmp / "out.jsonl"), "--temperature", "0",
               "--max-tokens", str(MAX_NEW), "--ignore-eos", "--block-size", "4", "--num-kv-blocks", "64",
               "--tensor-parallel-size", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    log = open(tmp / f"node{node_rank}.log", "w")  # a file, not a pipe: a full pipe would block the process
    return subprocess.Popen(command, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)


def test_two_torchrun_nodes_match_tp1(tmp_path) -> None:
    model = str(make_tiny_model("qwen2", tmp_path / "m"))
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"prompt_token_ids": p}) + "\n" for p in PROMPTS))
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
    llm = LLM(model=model, skip_tokenizer_init=True, block_size=4, num_kv_blocks=64)
    expected = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params,
                                                             use_tqdm=False)]
    port = free_port()
    nodes = [torchrun(rank, port, model, tmp_path) for rank in (0, 1)]
    try:
        for node in nodes:
            node.wait(timeout=300)
    finally:
        for node in nodes:
            node.kill()
    logs = "\n\n".join((tmp_path / f"node{rank}.log").read_text()[-3000:] for rank in (0, 1))
    assert [n.returncode for n in nodes] == [0, 0], logs
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["token_ids"] for r in rows] == expected
