"""The small types of the KV cache manager's API: what it reads of a request, a prefix-cache hit, its counters."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from lamina.kv.radix_cache import Node


class KVRequest(Protocol):
    """What the manager reads of a request (the engine's Request is one)."""

    @property
    def request_id(self) -> str: ...

    @property
    def all_token_ids(self) -> list[int]: ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def num_computed_tokens(self) -> int: ...


@dataclass
class PrefixMatch:
    """A prefix-cache hit: the tree path and the number of tokens it covers (len(nodes) * block_size)."""

    nodes: list[Node] = field(default_factory=list)
    num_tokens: int = 0


@dataclass(frozen=True)
class PrefixCacheStats:
    """Cumulative prefix-cache counters, in tokens: queried (prompt lengths) and served from the cache."""

    queries: int = 0
    hits: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0
