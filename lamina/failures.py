"""Which errors end one step's requests and which end the engine.

    error in a step                         what happens
    --------------------------------------  ----------------------------------------------------------------
    one request's own part (its sampling    that request ends with finish_reason "error", its KV blocks are
    row, its generator)                     freed; the rest of the batch goes on (ModelRunnerOutput.failed)
    the whole step (the forward raised,     every request of the step ends with "error", blocks freed; the
    e.g. device out of memory)              engine takes the next step (nothing is retried or split: one
                                            oversized prefill fails the decodes batched with it too)
    the device is lost (a CUDA error), or   EngineBrokenError: the engine cannot go on. The AsyncEngine fails
    MAX_FAILED_STEPS steps fail in a row    every in-flight request and a server exits non-zero (vLLM's way)
"""
from __future__ import annotations

import torch

MAX_FAILED_STEPS = 3  # consecutive failed steps that mean the engine, not a request, is broken

# Messages of errors after which the device (and so the engine) is unusable: the CUDA context is gone.
_DEVICE_LOST = ("CUDA error", "device-side assert", "illegal memory access", "unspecified launch failure",
                "CUBLAS_STATUS", "CUDNN_STATUS", "NCCL error", "ECC error")


class EngineBrokenError(RuntimeError):
    """The engine cannot take another step (device lost, or steps keep failing)."""


def is_fatal(err: BaseException) -> bool:
    """True for an error that no request caused and no retry fixes: the engine must stop."""
    if not isinstance(err, Exception) or isinstance(err, EngineBrokenError):
        return True  # KeyboardInterrupt, SystemExit, ...
    if isinstance(err, torch.OutOfMemoryError):
        return False  # this step asked for too much; the next steps, without its requests, may fit
    message = str(err)
    return isinstance(err, RuntimeError) and any(marker in message for marker in _DEVICE_LOST)
