"""ServerSettings: what `lamina serve` exposes and the limits it enforces on requests."""
from __future__ import annotations

from dataclasses import dataclass


def _require(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{name}: {message}")


@dataclass
class ServerSettings:
    """Server-side settings (the engine has its own EngineConfig).

    max_queue: a request is refused with 429 when it would make the waiting queue (requests beyond
    max_num_seqs, or held back by the scheduler) longer than this; None = no limit.
    """

    served_model_name: str
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None  # when set, /v1/* needs "Authorization: Bearer <api_key>"
    max_queue: int | None = 1024
    max_n: int = 16  # the most parallel samples (n) one request may ask for
    max_body_bytes: int = 4 << 20  # larger request bodies get 413
    model_root: str | None = None  # shown as "root" in /v1/models
    shutdown_timeout: float = 30.0  # seconds a SIGTERM waits for in-flight requests (lamina.server.shutdown)

    def __post_init__(self) -> None:
        _require(isinstance(self.served_model_name, str) and bool(self.served_model_name), "served_model_name",
                 f"must be a non-empty string, got {self.served_model_name!r}")
        _require(isinstance(self.port, int) and 0 <= self.port <= 65535, "port",
                 f"must be an integer in [0, 65535], got {self.port!r}")
        _require(self.api_key is None or (isinstance(self.api_key, str) and bool(self.api_key)), "api_key",
                 "must be a non-empty string or unset")
        _require(self.max_queue is None or (isinstance(self.max_queue, int) and self.max_queue >= 0),
                 "max_queue", f"must be an integer >= 0 or unset, got {self.max_queue!r}")
        _require(isinstance(self.max_n, int) and self.max_n >= 1, "max_n",
                 f"must be an integer >= 1, got {self.max_n!r}")
        _require(isinstance(self.max_body_bytes, int) and self.max_body_bytes >= 1024, "max_body_bytes",
                 f"must be an integer >= 1024, got {self.max_body_bytes!r}")
        _require(isinstance(self.shutdown_timeout, (int, float)) and 0 <= self.shutdown_timeout < float("inf"),
                 "shutdown_timeout", f"must be a finite number of seconds >= 0, got {self.shutdown_timeout!r}")
