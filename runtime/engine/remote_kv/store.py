"""What a remote KV store is to the engine: pages put and got by key, in batches."""

from __future__ import annotations

from typing import Protocol


class StoreUnavailable(Exception):
    """The store failed, or failed moments ago; the caller serves from its own pool."""


class PageStore(Protocol):
    """A shared store of page records (remote_kv.page_format), Mooncake-Store style.
    Implementations bound every call by a timeout and raise StoreUnavailable on a
    fault; they are called from the tier's threads, never from the compute thread."""

    name: str

    def put_many(self, items: list[tuple[str, bytes]]) -> None:
        """Store each (key, record); a key already present keeps its value and is refreshed."""
        ...

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        """The record under each key, None where there is none."""
        ...

    def ping(self) -> bool:
        """True when the store answers now (health), never raising."""
        ...

    def close(self) -> None: ...
