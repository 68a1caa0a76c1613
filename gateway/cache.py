"""AI Gateway response cache: keys, per-request cache headers, and memory/Redis stores."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from edgefire.contract.errors import InvalidInputError
from edgefire.gateway.redis_link import RedisGuard, RedisUnavailable, connect
from edgefire.gateway.settings import GatewaySettings

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


@dataclass(frozen=True, slots=True)
class CacheKey:
    """A request's cache key: the account the entry is charged to, and the digest of everything
    that identifies the request (which includes the account, see `cache_key`)."""

    account_id: str
    digest: str


class ResponseCache(Protocol):
    async def get(self, key: CacheKey) -> CachedResponse | None: ...

    async def set(self, key: CacheKey, value: CachedResponse, ttl_s: float) -> None: ...

    async def close(self) -> None: ...


def _check_ttl(ttl_s: float) -> None:
    if ttl_s <= 0:
        raise ValueError(f"cache TTL must be positive, got {ttl_s}")


# What Python holds per memory entry beyond its bytes (key, tuple, float, dict slot), so the
# budget bounds memory even when the answers are tiny.
ENTRY_OVERHEAD_BYTES = 512


@dataclass(slots=True)
class _AccountEntries:
    entries: OrderedDict[str, tuple[float, bytes]] = field(default_factory=OrderedDict)
    charged: int = 0  # bytes, overhead included


class MemoryCache:
    """A per-process cache with TTL expiry within a byte budget shared fairly by accounts.

    Answers larger than `max_entry_bytes` serialised are not stored. When the budget is
    exceeded, the account charged the most bytes gives up its least recently used entry, until
    the cache fits: an account filling the cache evicts its own entries first and never pushes
    another account below an equal share, while an account alone may use the whole budget.
    No method awaits, so each runs to completion without interleaving with other tasks.
    """

    def __init__(self, max_bytes: int = 256 << 20, max_entry_bytes: int = 8 << 20,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 1 <= max_entry_bytes <= max_bytes - ENTRY_OVERHEAD_BYTES:
            raise ValueError(f"cache budget {max_bytes} B must hold one entry of "
                             f"{max_entry_bytes} B plus {ENTRY_OVERHEAD_BYTES} B overhead")
        self._max_bytes = max_bytes
        self._max_entry_bytes = max_entry_bytes
        self._clock = clock
        # Entries are stored serialised: callers may mutate what `get` returns (adding a
        # cache-status header, say), and this also keeps the two backends behaving alike.
        self._accounts: dict[str, _AccountEntries] = {}
        self._charged = 0

    @property
    def charged_bytes(self) -> int:
        """The bytes held, overhead included; never above the budget after a `set`."""
        return self._charged

    async def get(self, key: CacheKey) -> CachedResponse | None:
        account = self._accounts.get(key.account_id)
        entry = None if account is None else account.entries.get(key.digest)
        if entry is None:
            return None
        expires_at, data = entry
        if self._clock() >= expires_at:
            self._remove(key.account_id, key.digest)
            return None
        account.entries.move_to_end(key.digest)
        return CachedResponse.from_bytes(data)

    async def set(self, key: CacheKey, value: CachedResponse, ttl_s: float) -> None:
        _check_ttl(ttl_s)
        data = value.to_bytes()
        if len(data) > self._max_entry_bytes:
            return
        self._remove(key.account_id, key.digest)
        account = self._accounts.setdefault(key.account_id, _AccountEntries())
        account.entries[key.digest] = (self._clock() + ttl_s, data)
        account.charged += len(data) + ENTRY_OVERHEAD_BYTES
        self._charged += len(data) + ENTRY_OVERHEAD_BYTES
        while self._charged > self._max_bytes:
            account_id, largest = max(self._accounts.items(), key=lambda item: item[1].charged)
            self._remove(account_id, next(iter(largest.entries)))

    def _remove(self, account_id: str, digest: str) -> None:
        account = self._accounts.get(account_id)
        entry = None if account is None else account.entries.pop(digest, None)
        if entry is None:
            return
        cost = len(entry[1]) + ENTRY_OVERHEAD_BYTES
        account.charged -= cost
        self._charged -= cost
        if not account.entries:
            del self._accounts[account_id]

    async def close(self) -> None:
        self._accounts.clear()
        self._charged = 0


class RedisCache:
    """A cache shared by every gateway process pointed at the same Redis; Redis expires entries.

    A Redis fault reads as a miss and skips the store (see edgefire.gateway.redis_link), so a
    dead or silent Redis slows requests by at most a timeout now and then and never fails them.
    """

    def __init__(self, url: str, prefix: str = "edgefire:cache:", *,
                 max_entry_bytes: int = 8 << 20, timeout_s: float = 0.5) -> None:
        self._redis = connect(url, timeout_s)
        self._guard = RedisGuard("response cache")
        self._prefix = prefix
        self._max_entry_bytes = max_entry_bytes

    async def get(self, key: CacheKey) -> CachedResponse | None:
        try:
            data = await self._guard.run(self._redis.get, self._prefix + key.digest)
        except RedisUnavailable:
            return None
        return None if data is None else CachedResponse.from_bytes(data)

    async def set(self, key: CacheKey, value: CachedResponse, ttl_s: float) -> None:
        _check_ttl(ttl_s)
        data = value.to_bytes()
        if len(data) > self._max_entry_bytes:
            return
        # PX rather than EX so sub-second TTLs are not rounded away to zero (an error in Redis).
        with contextlib.suppress(RedisUnavailable):
            await self._guard.run(self._redis.set, self._prefix + key.digest, data,
                                  px=max(1, round(ttl_s * 1000)))

    async def close(self) -> None:
        await self._redis.aclose()


def make_cache(settings: GatewaySettings) -> ResponseCache:
    if settings.redis_url:
        return RedisCache(settings.redis_url, max_entry_bytes=settings.cache_max_entry_bytes,
                          timeout_s=settings.redis_timeout_s)
    return MemoryCache(settings.cache_max_bytes, settings.cache_max_entry_bytes)


def _digest(parts: Iterable[bytes]) -> str:
    # Each part is length-prefixed, so no choice of ids, path or body can shift a boundary
    # and make two different requests hash the same byte stream.
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


def cache_key(account_id: str, gateway_id: str, provider: str, path: str, body: bytes,
              custom_key: str | None = None) -> CacheKey:
    """The cache key of a request: a hex SHA-256 that is always scoped to account and gateway.

    A custom key (`cf-aig-cache-key`) stands in for path and body only, so two accounts (or two
    gateways) sending the same custom key still get separate entries. The mode tag keeps a
    custom key from ever colliding with a path/body pair.
    """
    scope = [b"edgefire-cache-v1", account_id.encode(), gateway_id.encode(), provider.encode()]
    if custom_key is not None:
        return CacheKey(account_id, _digest([*scope, b"custom", custom_key.encode()]))
    return CacheKey(account_id, _digest([*scope, b"request", path.encode(), body]))


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
_DIGITS = re.compile(r"[0-9]{1,12}")  # more is no TTL (and past 4300 digits int() refuses)


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
