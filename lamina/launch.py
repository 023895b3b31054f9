"""Tensor parallelism across nodes: the same command on every node, under torchrun.

    torchrun --nnodes 2 --nproc-per-node 1 --node-rank <0|1> --rdzv-backend c10d \\
             --rdzv-endpoint <host of node 0>:29500 --rdzv-id <any id, the same on every node> \\
             -m lamina.launch generate --model <dir> --tensor-parallel-size 2 --input prompts.jsonl

The process torchrun gives RANK 0 runs the `lamina` command line that follows (generate, chat, serve, ...);
its engine joins the group through torchrun's environment (env://) instead of spawning workers. Every other
rank becomes a worker (lamina/executor/tp_worker.py): it receives the engine's config from rank 0, loads its
shard of the model from its own copy of the checkpoint (the same path on every node), and runs the steps rank
0 broadcasts until rank 0 shuts down. This module is an entry point: nothing in lamina imports it.
"""
from __future__ import annotations

import os
import sys

from lamina.distributed.parallel_state import ExternalLaunch, set_external_launch

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def launch_from_environment(environ: dict[str, str]) -> ExternalLaunch:
    """torchrun's variables -> ExternalLaunch; a clear error when this process was not started by torchrun."""
    missing = [name for name in _TORCHRUN_VARS if name not in environ]
    if missing:
        raise SystemExit(f"lamina.launch runs under torchrun (missing {', '.join(missing)}); on one "
                         "node use `lamina ... --tensor-parallel-size N` directly (docs/distributed.md)")
    return ExternalLaunch(int(environ["RANK"]), int(environ["WORLD_SIZE"]), int(environ["LOCAL_RANK"]))


def main(argv: list[str] | None = None) -> int:
    launch = launch_from_environment(dict(os.environ))
    if launch.rank == 0:
        set_external_launch(launch)
        from lamina.cli import main as cli_main
        return cli_main(argv)
    from lamina.executor.tp_worker import run_external_worker
    return run_external_worker(launch)


if __name__ == "__main__":
    sys.exit(main())
