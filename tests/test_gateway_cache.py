"""AI Gateway cache: keys, cache headers, and the memory and Redis stores."""

from __future__ import annotations

import asyncio

import pytest
import redis

from edgefire.contract.errors import InvalidInputError
from edgefire.gateway.cache import (
    DEFAULT_CUSTOM_KEY_TTL_S,
    ENTRY_OVERHEAD_BYTES,
    MAX_CACHE_TTL_S,
    MIN_CACHE_TTL_S,
    CachedResponse,
    CacheKey,
    CachePolicy,
    MemoryCache,
    RedisCache,
    cache_key,
    make_cache,
    parse_cache_headers,
)
from edgefire.gateway.settings import GatewaySettings
from tests.redis_support import REDIS_URL, TIMEOUT_S, FakeClock, needs_redis

RESPONSE = CachedResponse(200, {"content-type": "application/json", "x-ü": "ünïcode"},
                          b'{"result":{"response":"hi"}}\x00\xff')
K = CacheKey("acct", "k")


def _key(name: str, account_id: str = "acct") -> CacheKey:
    return CacheKey(account_id, name)


def _sized(n: int) -> CachedResponse:
    """A response that serialises to exactly n bytes."""
    overhead = len(CachedResponse(200, {}, b"").to_bytes())
    return CachedResponse(200, {}, b"x" * (n - overhead))


def test_cached_response_round_trips() -> None:
    assert CachedResponse.from_bytes(RESPONSE.to_bytes()) == RESPONSE
    empty = CachedResponse(204, {}, b"")
    assert CachedResponse.from_bytes(empty.to_bytes()) == empty


def test_memory_cache_get_set_and_ttl_expiry() -> None:
    clock = FakeClock()
    cache = MemoryCache(clock=clock)

    async def main() -> None:
        assert await cache.get(K) is None
        await cache.set(K, RESPONSE, ttl_s=60)
        assert await cache.get(K) == RESPONSE
        assert await cache.get(CacheKey("other", "k")) is None
        clock.now += 59.9
        assert await cache.get(K) == RESPONSE
        clock.now += 0.1
        assert await cache.get(K) is None
        assert cache.charged_bytes == 0

    asyncio.run(main())


def test_memory_cache_returns_copies() -> None:
    cache = MemoryCache()

    async def main() -> None:
        await cache.set(K, RESPONSE, ttl_s=60)
        hit = await cache.get(K)
        hit.headers["cf-aig-cache-status"] = "HIT"
        assert await cache.get(K) == RESPONSE

    asyncio.run(main())


def test_memory_cache_evicts_least_recently_used_within_its_byte_budget() -> None:
    entry = 1000 + ENTRY_OVERHEAD_BYTES
    cache = MemoryCache(max_bytes=3 * entry, max_entry_bytes=3 * entry - ENTRY_OVERHEAD_BYTES)

    async def main() -> None:
        for name in "abc":
            await cache.set(_key(name), _sized(1000), ttl_s=60)
        assert cache.charged_bytes == 3 * entry
        assert await cache.get(_key("a")) is not None  # "b" is now least recently used
        await cache.set(_key("d"), _sized(1000), ttl_s=60)
        assert await cache.get(_key("b")) is None
        for name in "acd":
            assert await cache.get(_key(name)) is not None
        await cache.set(_key("a"), _sized(1000), ttl_s=60)  # a replacement is charged once
        assert cache.charged_bytes == 3 * entry
        # A bigger entry evicts as many as it needs.
        await cache.set(_key("big"), _sized(3 * entry - ENTRY_OVERHEAD_BYTES), ttl_s=60)
        assert [await cache.get(_key(n)) is not None for n in "acd"] == [False] * 3

    asyncio.run(main())
    with pytest.raises(ValueError):
        MemoryCache(max_bytes=1000, max_entry_bytes=1000)  # one entry could never fit


def test_memory_cache_does_not_store_answers_over_the_entry_cap() -> None:
    cache = MemoryCache(max_bytes=1 << 20, max_entry_bytes=4096)

    async def main() -> None:
        await cache.set(_key("small"), _sized(4096), ttl_s=60)
        await cache.set(_key("big"), _sized(4097), ttl_s=60)
        assert await cache.get(_key("small")) is not None
        assert await cache.get(_key("big")) is None
        assert cache.charged_bytes == 4096 + ENTRY_OVERHEAD_BYTES

    asyncio.run(main())


def test_memory_cache_one_account_cannot_evict_the_others() -> None:
    entry = 1000 + ENTRY_OVERHEAD_BYTES
    cache = MemoryCache(max_bytes=10 * entry, max_entry_bytes=1000)

    async def main() -> None:
        for i in range(3):
            await cache.set(_key(f"b{i}", "b"), _sized(1000), ttl_s=60)
        for i in range(2):
            await cache.set(_key(f"c{i}", "c"), _sized(1000), ttl_s=60)
        # Account a floods the cache: it evicts only its own entries...
        for i in range(100):
            await cache.set(_key(f"a{i}", "a"), _sized(1000), ttl_s=60)
        assert cache.charged_bytes == 10 * entry
        for key in [_key(f"b{i}", "b") for i in range(3)] + [_key(f"c{i}", "c") for i in range(2)]:
            assert await cache.get(key) is not None, key
        # ...least recently used first, keeping its newest five.
        assert [await cache.get(_key(f"a{i}", "a")) is not None for i in range(94, 100)] == \
            [False] + [True] * 5
        # The account holding the most gives way to one holding less.
        await cache.set(_key("b3", "b"), _sized(1000), ttl_s=60)
        held = {name: sum([await cache.get(_key(f"{name}{i}", name)) is not None
                           for i in range(100)]) for name in "abc"}
        assert held == {"a": 4, "b": 4, "c": 2}

    asyncio.run(main())


def test_cache_rejects_non_positive_ttl() -> None:
    with pytest.raises(ValueError):
        asyncio.run(MemoryCache().set(K, RESPONSE, ttl_s=0))


def test_cache_key_scoping() -> None:
    base = ("acct-a", "gw", "workers-ai", "@cf/meta/llama-3.1-8b-instruct", b'{"prompt":"hi"}')
    assert cache_key(*base) == cache_key(*base)
    assert cache_key(*base).account_id == "acct-a" and len(cache_key(*base).digest) == 64
    assert cache_key(*base) != cache_key(*base[:4], b'{"prompt":"ho"}')
    assert cache_key(*base) != cache_key("acct-b", *base[1:])
    assert cache_key(*base) != cache_key("acct-a", "gw2", *base[2:])
    # Length prefixes: moving bytes between path and body changes the key.
    assert cache_key("a", "g", "p", "x", b"yz") != cache_key("a", "g", "p", "xy", b"z")

    custom = cache_key(*base, custom_key="shared")
    assert custom == cache_key("acct-a", "gw", "workers-ai", "/other", b"other", "shared")
    assert custom != cache_key("acct-b", *base[1:], custom_key="shared")
    assert custom != cache_key("acct-a", "gw2", *base[2:], custom_key="shared")
    assert custom != cache_key(*base)


def test_make_cache_picks_backend() -> None:
    assert isinstance(make_cache(GatewaySettings(redis_url=None)), MemoryCache)
    cache = make_cache(GatewaySettings(redis_url=REDIS_URL))  # connects lazily: needs no server
    assert isinstance(cache, RedisCache)
    asyncio.run(cache.close())


@pytest.mark.parametrize(("headers", "gateway_ttl", "expected"), [
    ({}, None, CachePolicy(False, None, False, None)),
    ({}, 0, CachePolicy(False, None, False, None)),
    ({}, 120, CachePolicy(True, 120, False, None)),
    ({}, 5, CachePolicy(True, MIN_CACHE_TTL_S, False, None)),
    ({"cf-aig-cache-ttl": "3600"}, None, CachePolicy(True, 3600, False, None)),
    ({"CF-AIG-Cache-TTL": "3600"}, 120, CachePolicy(True, 3600, False, None)),
    ({"cf-aig-cache-ttl": "10"}, None, CachePolicy(True, MIN_CACHE_TTL_S, False, None)),
    ({"cf-aig-cache-ttl": "99999999"}, None, CachePolicy(True, MAX_CACHE_TTL_S, False, None)),
    ({"cf-aig-cache-ttl": "0"}, 600, CachePolicy(False, None, False, None)),
    ({"cf-cache-ttl": "90"}, None, CachePolicy(True, 90, False, None)),
    ({"cf-cache-ttl": "90", "cf-aig-cache-ttl": "120"}, None, CachePolicy(True, 120, False, None)),
    ({"cf-aig-skip-cache": "true"}, 120, CachePolicy(True, 120, True, None)),
    ({"cf-aig-skip-cache": "FALSE"}, 120, CachePolicy(True, 120, False, None)),
    ({"cf-skip-cache": "true"}, 120, CachePolicy(True, 120, True, None)),
    ({"cf-aig-cache-key": "k1"}, None, CachePolicy(True, DEFAULT_CUSTOM_KEY_TTL_S, False, "k1")),
    ({"cf-aig-cache-key": "k1"}, 900, CachePolicy(True, 900, False, "k1")),
    ({"cf-aig-cache-key": "k1", "cf-aig-cache-ttl": "61"}, None,
     CachePolicy(True, 61, False, "k1")),
])
def test_parse_cache_headers(headers, gateway_ttl, expected) -> None:
    assert parse_cache_headers(headers, gateway_ttl) == expected


@pytest.mark.parametrize(("name", "value"), [
    ("cf-aig-cache-ttl", "soon"),
    ("cf-aig-cache-ttl", "-60"),
    ("cf-aig-cache-ttl", "60.5"),
    ("cf-cache-ttl", ""),
    ("cf-aig-skip-cache", "yes"),
    ("cf-skip-cache", "1"),
    ("cf-aig-cache-key", " "),
])
def test_parse_cache_headers_rejects_bad_values(name, value) -> None:
    with pytest.raises(InvalidInputError, match=name) as info:
        parse_cache_headers({name: value}, None)
    assert info.value.field == name
    assert info.value.status == 400


@needs_redis
def test_redis_cache_get_set_and_expiry(redis_prefix: str) -> None:
    async def main() -> None:
        cache = RedisCache(REDIS_URL, prefix=redis_prefix, timeout_s=TIMEOUT_S)
        try:
            assert await cache.get(K) is None
            await cache.set(K, RESPONSE, ttl_s=60)
            await cache.set(_key("short"), RESPONSE, ttl_s=0.2)
            assert await cache.get(K) == RESPONSE
            assert await cache.get(_key("short")) == RESPONSE
            await asyncio.sleep(0.4)
            assert await cache.get(_key("short")) is None
            assert await cache.get(K) == RESPONSE
        finally:
            await cache.close()

    asyncio.run(main())
    with redis.Redis.from_url(REDIS_URL) as client:
        assert 0 < client.pttl(redis_prefix + "k") <= 60_000


@needs_redis
def test_redis_cache_is_shared_between_processes(redis_prefix: str) -> None:
    key = cache_key("acct", "gw", "workers-ai", "@cf/model", b"{}")

    async def main() -> None:
        first, second = (RedisCache(REDIS_URL, redis_prefix, timeout_s=TIMEOUT_S)
                         for _ in range(2))
        try:
            assert await second.get(key) is None
            await first.set(key, RESPONSE, ttl_s=60)
            assert await second.get(key) == RESPONSE
            # Another account's request under the same custom key stays a miss.
            other = cache_key("other", "gw", "workers-ai", "@cf/model", b"{}", "custom")
            await first.set(cache_key("acct", "gw", "workers-ai", "", b"", "custom"),
                            RESPONSE, ttl_s=60)
            assert await second.get(other) is None
        finally:
            await first.close()
            await second.close()

    asyncio.run(main())


@needs_redis
def test_redis_cache_does_not_store_answers_over_the_entry_cap(redis_prefix: str) -> None:
    async def main() -> None:
        cache = RedisCache(REDIS_URL, prefix=redis_prefix, max_entry_bytes=4096,
                           timeout_s=TIMEOUT_S)
        try:
            await cache.set(_key("small"), _sized(4096), ttl_s=60)
            await cache.set(_key("big"), _sized(4097), ttl_s=60)
            assert await cache.get(_key("small")) is not None
            assert await cache.get(_key("big")) is None
        finally:
            await cache.close()

    asyncio.run(main())
    with redis.Redis.from_url(REDIS_URL) as client:
        assert client.exists(redis_prefix + "big") == 0
