"""AI Gateway cache: keys, cache headers, and the memory and Redis stores."""

from __future__ import annotations

import asyncio

import pytest
import redis

from gateway.cache import (
    DEFAULT_CUSTOM_KEY_TTL_S,
    MAX_CACHE_TTL_S,
    MIN_CACHE_TTL_S,
    CachedResponse,
    CachePolicy,
    MemoryCache,
    RedisCache,
    cache_key,
    make_cache,
    parse_cache_headers,
)
from runtime.errors import InvalidInputError
from tests.redis_support import REDIS_URL, FakeClock, needs_redis

RESPONSE = CachedResponse(200, {"content-type": "application/json", "x-ü": "ünïcode"},
                          b'{"result":{"response":"hi"}}\x00\xff')


def test_cached_response_round_trips() -> None:
    assert CachedResponse.from_bytes(RESPONSE.to_bytes()) == RESPONSE
    empty = CachedResponse(204, {}, b"")
    assert CachedResponse.from_bytes(empty.to_bytes()) == empty


def test_memory_cache_get_set_and_ttl_expiry() -> None:
    clock = FakeClock()
    cache = MemoryCache(clock=clock)

    async def main() -> None:
        assert await cache.get("k") is None
        await cache.set("k", RESPONSE, ttl_s=60)
        assert await cache.get("k") == RESPONSE
        clock.now += 59.9
        assert await cache.get("k") == RESPONSE
        clock.now += 0.1
        assert await cache.get("k") is None

    asyncio.run(main())


def test_memory_cache_returns_copies() -> None:
    cache = MemoryCache()

    async def main() -> None:
        await cache.set("k", RESPONSE, ttl_s=60)
        hit = await cache.get("k")
        hit.headers["cf-aig-cache-status"] = "HIT"
        assert await cache.get("k") == RESPONSE

    asyncio.run(main())


def test_memory_cache_evicts_least_recently_used() -> None:
    cache = MemoryCache(max_entries=3)

    async def main() -> None:
        for key in "abc":
            await cache.set(key, RESPONSE, ttl_s=60)
        assert await cache.get("a") is not None  # "b" is now least recently used
        await cache.set("d", RESPONSE, ttl_s=60)
        assert await cache.get("b") is None
        for key in "acd":
            assert await cache.get(key) is not None

    asyncio.run(main())


def test_cache_rejects_non_positive_ttl() -> None:
    with pytest.raises(ValueError):
        asyncio.run(MemoryCache().set("k", RESPONSE, ttl_s=0))


def test_cache_key_scoping() -> None:
    base = ("acct-a", "gw", "workers-ai", "@cf/meta/llama-3.1-8b-instruct", b'{"prompt":"hi"}')
    assert cache_key(*base) == cache_key(*base)
    assert len(cache_key(*base)) == 64
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
    assert isinstance(make_cache(None), MemoryCache)
    cache = make_cache(REDIS_URL)  # connects lazily, so this needs no server
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
        cache = RedisCache(REDIS_URL, prefix=redis_prefix)
        try:
            assert await cache.get("k") is None
            await cache.set("k", RESPONSE, ttl_s=60)
            await cache.set("short", RESPONSE, ttl_s=0.2)
            assert await cache.get("k") == RESPONSE
            assert await cache.get("short") == RESPONSE
            await asyncio.sleep(0.4)
            assert await cache.get("short") is None
            assert await cache.get("k") == RESPONSE
        finally:
            await cache.close()

    asyncio.run(main())
    with redis.Redis.from_url(REDIS_URL) as client:
        assert 0 < client.pttl(redis_prefix + "k") <= 60_000


@needs_redis
def test_redis_cache_is_shared_between_processes(redis_prefix: str) -> None:
    key = cache_key("acct", "gw", "workers-ai", "@cf/model", b"{}")

    async def main() -> None:
        first, second = RedisCache(REDIS_URL, redis_prefix), RedisCache(REDIS_URL, redis_prefix)
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
