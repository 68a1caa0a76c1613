"""AI Gateway response cache: keys, per-request cache headers, and memory/Redis stores."""

from __future__ import annotations

import hashlib
import json
import re
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

import redis.asyncio as aioredis

from runtime.errors import InvalidInputError

MIN_CACHE_TTL_S = 60
MAX_CACHE_TTL_S = 30 * 24 * 3600
DEFAULT_CUSTOM_KEY_TTL_S = 300

# Version byte, status, length of the JSON headers; the body follows the headers raw so a large
# response is never base64- or JSON-escaped.
_WIRE = struct.Struct(">BHI")
_WIRE_VERSION = 1


@dataclass(slots=True)
class CachedResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def to_bytes(self) -> bytes:
        head = json.dumps(self.headers, separators=(",", ":")).encode()
        return _WIRE.pack(_WIRE_VERSION, self.status, len(head)) + head + self.body

    @classmethod
    def from_bytes(cls, data: bytes) -> CachedResponse:
        version, status, head_len = _WIRE.unpack_from(data)
        if version != _WIRE_VERSION:
            raise ValueError(f"unknown cached response format version {version}")
        start = _WIRE.size
        headers = json.loads(data[start:start + head_len])
        return cls(status=status, headers=headers, body=bytes(data[start + head_len:]))


class ResponseCache(Protocol):
    async def get(self, key: str) -> CachedResponse | None: ...

    async def set(self, key: str, value: CachedResponse, ttl_s: float) -> None: ...

    async def close(self) -> None: ...


def _check_ttl(ttl_s: float) -> None:
    if ttl_s <= 0:
        raise ValueError(f"cache TTL must be positive, got {ttl_s}")


class MemoryCache:
    """A per-process cache with TTL expiry, bounded to `max_entries` by evicting the LRU entry.

    No method awaits, so each runs to completion without interleaving with other tasks.
    """

    def __init__(self, max_entries: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._max_entries = max_entries
        self._clock = clock
        # Entries are stored serialised: callers may mutate what `get` returns (adding a
        # cache-status header, say), and this also keeps the two backends behaving alike.
        self._entries: OrderedDict[str, tuple[float, bytes]] = OrderedDict()

    async def get(self, key: str) -> CachedResponse | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires_at, data = entry
        if self._clock() >= expires_at:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return CachedResponse.from_bytes(data)

    async def set(self, key: str, value: CachedResponse, ttl_s: float) -> None:
        _check_ttl(ttl_s)
        self._entries[key] = (self._clock() + ttl_s, value.to_bytes())
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    async def close(self) -> None:
        self._entries.clear()


class RedisCache:
    """A cache shared by every gateway process pointed at the same Redis; Redis expires entries."""

    def __init__(self, url: str, prefix: str = "edgefire:cache:") -> None:
        self._redis = aioredis.from_url(url)
        self._prefix = prefix

    async def get(self, key: str) -> CachedResponse | None:
        data = await self._redis.get(self._prefix + key)
        return None if data is None else CachedResponse.from_bytes(data)

    async def set(self, key: str, value: CachedResponse, ttl_s: float) -> None:
        _check_ttl(ttl_s)
        # PX rather than EX so sub-second TTLs are not rounded away to zero (an error in Redis).
        await self._redis.set(self._prefix + key, value.to_bytes(), px=max(1, round(ttl_s * 1000)))

    async def close(self) -> None:
        await self._redis.aclose()


def make_cache(redis_url: str | None) -> ResponseCache:
    return RedisCache(redis_url) if redis_url else MemoryCache()


def _digest(parts: Iterable[bytes]) -> str:
    # Each part is length-prefixed, so no choice of ids, path or body can shift a boundary
    # and make two different requests hash the same byte stream.
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


def cache_key(account_id: str, gateway_id: str, provider: str, path: str, body: bytes,
              custom_key: str | None = None) -> str:
    """The cache key of a request: a hex SHA-256 that is always scoped to account and gateway.

    A custom key (`cf-aig-cache-key`) stands in for path and body only, so two accounts (or two
    gateways) sending the same custom key still get separate entries. The mode tag keeps a
    custom key from ever colliding with a path/body pair.
    """
    scope = [b"edgefire-cache-v1", account_id.encode(), gateway_id.encode(), provider.encode()]
    if custom_key is not None:
        return _digest([*scope, b"custom", custom_key.encode()])
    return _digest([*scope, b"request", path.encode(), body])


@dataclass(slots=True)
class CachePolicy:
    """How to cache one request.

    `enabled`: a TTL applies (`ttl_s`, already clamped), so a response may be stored and served.
    `skip`: the request bypasses the cache, neither reading nor storing an entry.
    `custom_key`: the `cf-aig-cache-key` value to pass to `cache_key`, if any.
    """

    enabled: bool
    ttl_s: int | None
    skip: bool
    custom_key: str | None


def clamp_ttl(ttl_s: int) -> int:
    return min(max(ttl_s, MIN_CACHE_TTL_S), MAX_CACHE_TTL_S)


_TTL_HEADERS = ("cf-aig-cache-ttl", "cf-cache-ttl")
_SKIP_HEADERS = ("cf-aig-skip-cache", "cf-skip-cache")
_KEY_HEADER = "cf-aig-cache-key"
_DIGITS = re.compile(r"[0-9]+")


def _first(headers: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    # The current header name wins over its deprecated alias when a client sends both.
    for name in names:
        if name in headers:
            return name, headers[name]
    return None


def _invalid(name: str, value: str, expected: str) -> InvalidInputError:
    return InvalidInputError(f"Invalid {name} header {value[:64]!r}: expected {expected}",
                             field=name)


def parse_cache_headers(headers: Mapping[str, str], gateway_ttl: int | None) -> CachePolicy:
    """The cache policy of a request from its headers and the gateway's `cache_ttl`.

    A TTL header overrides the gateway's TTL and "0" turns caching off for the request; other
    TTLs are clamped to [60 s, 1 month]. Without either, a custom key alone caches for 5 minutes.
    """
    lowered = {name.lower(): value for name, value in headers.items()}
    ttl: int | None = clamp_ttl(gateway_ttl) if gateway_ttl else None

    custom_key = lowered.get(_KEY_HEADER)
    if custom_key is not None:
        if not custom_key.strip():
            raise _invalid(_KEY_HEADER, custom_key, "a non-empty string")
        if ttl is None:
            ttl = DEFAULT_CUSTOM_KEY_TTL_S

    if found := _first(lowered, _TTL_HEADERS):
        name, value = found
        if not _DIGITS.fullmatch(value.strip()):
            raise _invalid(name, value, "a whole number of seconds")
        seconds = int(value)
        ttl = clamp_ttl(seconds) if seconds > 0 else None

    skip = False
    if found := _first(lowered, _SKIP_HEADERS):
        name, value = found
        flag = value.strip().lower()
        if flag not in ("true", "false"):
            raise _invalid(name, value, '"true" or "false"')
        skip = flag == "true"

    return CachePolicy(enabled=ttl is not None, ttl_s=ttl, skip=skip, custom_key=custom_key)
