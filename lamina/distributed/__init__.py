"""Tensor parallelism on torch.distributed (NCCL on GPUs, gloo on CPU): the parallel state the layers read
(parallel_state.py), the collectives they call (communication.py), and the `torchrun` entry point (launch.py).
The multi-process executor that starts and drives the ranks is lamina/executor/multiproc.py."""
