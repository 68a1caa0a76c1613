"""AI Gateway rate limiting: fixed and sliding windows, in memory and in Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis

from edgefire.gateway.ratelimit import (
    MemoryRateLimiter,
    RateLimiter,
    RedisRateLimiter,
    make_rate_limiter,
)
from edgefire.gateway.settings import GatewaySettings
from tests.redis_support import REDIS_URL, TIMEOUT_S, FakeClock, needs_redis

Factory = Callable[[FakeClock], RateLimiter]




@pytest.fixture(params=["memory", pytest.param("redis", marks=needs_redis)])
def new_limiter(request: pytest.FixtureRequest) -> Factory:
    """Builds a limiter of the parametrised backend; Redis ones share one test prefix, as
    gateway processes sharing a Redis would."""
    if request.param == "memory":
        return lambda clock: MemoryRateLimiter(clock=clock)
    prefix = request.getfixturevalue("redis_prefix")
    return lambda clock: RedisRateLimiter(REDIS_URL, prefix=prefix, clock=clock,
                                           timeout_s=TIMEOUT_S)


async def _hits(limiter: RateLimiter, n: int, limit: int, interval_s: int,
                technique: str) -> list[bool]:
    return [(await limiter.hit("gw", limit, interval_s, technique)).allowed for _ in range(n)]


@pytest.mark.parametrize(("technique", "retry_after"), [("fixed", 20.0), ("sliding", 60.0)])
def test_exactly_limit_allowed_within_a_window(new_limiter: Factory, technique: str,
                                               retry_after: float) -> None:
    async def main() -> None:
        limiter = new_limiter(FakeClock(1000.0))
        try:
            decisions = [await limiter.hit("gw", 5, 60, technique) for _ in range(8)]
            assert [d.allowed for d in decisions] == [True] * 5 + [False] * 3
            assert [d.remaining for d in decisions] == [4, 3, 2, 1, 0, 0, 0, 0]
            assert {d.limit for d in decisions} == {5}
            assert [d.retry_after_s for d in decisions[:5]] == [0.0] * 5
            # Fixed: the window [960, 1020) ends in 20 s; sliding: the first hit ages out in 60 s.
            assert decisions[5].retry_after_s == pytest.approx(retry_after)
            # Keys are independent.
            assert (await limiter.hit("other-gw", 5, 60, technique)).allowed
        finally:
            await limiter.close()

    asyncio.run(main())


def test_fixed_window_resets_at_the_boundary(new_limiter: Factory) -> None:
    async def main() -> None:
        clock = FakeClock(1019.5)
        limiter = new_limiter(clock)
        try:
            assert await _hits(limiter, 5, 5, 60, "fixed") == [True] * 5
            refused = await limiter.hit("gw", 5, 60, "fixed")
            assert not refused.allowed
            assert refused.retry_after_s == pytest.approx(0.5)
            clock.now = 1020.0
            assert await _hits(limiter, 6, 5, 60, "fixed") == [True] * 5 + [False]
        finally:
            await limiter.close()

    asyncio.run(main())


def test_sliding_refuses_a_burst_straddling_a_fixed_boundary(new_limiter: Factory) -> None:
    async def main() -> None:
        clock = FakeClock(590.0)
        limiter = new_limiter(clock)
        try:
            for technique in ("fixed", "sliding"):
                assert await _hits(limiter, 10, 10, 600, technique) == [True] * 10
            clock.now = 610.0
            # 10 at 12:09 and 10 at 12:11 are fine for fixed 10 per 10 minutes...
            assert await _hits(limiter, 10, 10, 600, "fixed") == [True] * 10
            # ...but a trailing 10-minute window would hold 20.
            refused = await limiter.hit("gw", 10, 600, "sliding")
            assert not refused.allowed
            assert refused.retry_after_s == pytest.approx(580.0)
            clock.now = 1189.9
            assert not (await limiter.hit("gw", 10, 600, "sliding")).allowed
            clock.now = 1190.0
            assert await _hits(limiter, 11, 10, 600, "sliding") == [True] * 10 + [False]
        finally:
            await limiter.close()

    asyncio.run(main())


def test_sliding_window_trails_each_hit(new_limiter: Factory) -> None:
    async def main() -> None:
        clock = FakeClock(0.0)
        limiter = new_limiter(clock)
        try:
            for t in (0.0, 4.0, 8.0):
                clock.now = t
                assert (await limiter.hit("gw", 3, 10, "sliding")).allowed
            clock.now = 9.0
            refused = await limiter.hit("gw", 3, 10, "sliding")
            assert (refused.allowed, refused.retry_after_s) == (False, pytest.approx(1.0))
            clock.now = 10.0  # the hit at t=0 has left the window (10 s, 0 s]
            allowed = await limiter.hit("gw", 3, 10, "sliding")
            assert (allowed.allowed, allowed.remaining) == (True, 0)
            clock.now = 11.0
            refused = await limiter.hit("gw", 3, 10, "sliding")
            assert refused.retry_after_s == pytest.approx(3.0)  # when the t=4 hit ages out
        finally:
            await limiter.close()

    asyncio.run(main())


def test_sliding_limit_lowered_with_a_full_log(new_limiter: Factory) -> None:
    async def main() -> None:
        clock = FakeClock(0.0)
        limiter = new_limiter(clock)
        try:
            for t in range(5):
                clock.now = float(t)
                assert (await limiter.hit("gw", 5, 10, "sliding")).allowed
            clock.now = 5.0
            refused = await limiter.hit("gw", 2, 10, "sliding")
            # Hits at 0..3 must age out to leave a single one (at 4) in the window.
            assert (refused.allowed, refused.retry_after_s) == (False, pytest.approx(8.0))
            clock.now = 13.0
            assert (await limiter.hit("gw", 2, 10, "sliding")).allowed
        finally:
            await limiter.close()

    asyncio.run(main())


@pytest.mark.parametrize("technique", ["fixed", "sliding"])
def test_concurrent_hits_allow_exactly_the_limit(new_limiter: Factory, technique: str) -> None:
    async def main() -> None:
        limiter = new_limiter(FakeClock(1000.0))
        try:
            decisions = await asyncio.gather(
                *(limiter.hit("gw", 20, 60, technique) for _ in range(50)))
        finally:
            await limiter.close()
        allowed = [d for d in decisions if d.allowed]
        assert len(allowed) == 20
        assert sorted(d.remaining for d in allowed) == list(range(20))

    asyncio.run(main())


@needs_redis
@pytest.mark.parametrize("technique", ["fixed", "sliding"])
def test_redis_limit_holds_across_processes(redis_prefix: str, technique: str) -> None:
    async def main() -> list[bool]:
        clock = FakeClock(1000.0)
        first = RedisRateLimiter(REDIS_URL, prefix=redis_prefix, clock=clock,
                                 timeout_s=TIMEOUT_S)
        second = RedisRateLimiter(REDIS_URL, prefix=redis_prefix, clock=clock,
                                 timeout_s=TIMEOUT_S)
        try:
            decisions = await asyncio.gather(
                *(limiter.hit("gw", 20, 60, technique)
                  for _ in range(25) for limiter in (first, second)))
        finally:
            await first.close()
            await second.close()
        return [d.allowed for d in decisions]

    assert asyncio.run(main()).count(True) == 20
    with redis.Redis.from_url(REDIS_URL) as client:
        keys = list(client.scan_iter(match=redis_prefix + "*"))
        assert len(keys) == 1
        # Every key expires on its own, so idle gateways leave nothing behind.
        assert 0 < client.pttl(keys[0]) <= 60_000


def test_invalid_arguments_are_rejected() -> None:
    limiter = MemoryRateLimiter()
    for args in ((0, 60, "fixed"), (5, 0, "sliding"), (5, 60, "leaky")):
        with pytest.raises(ValueError):
            asyncio.run(limiter.hit("gw", *args))


def test_make_rate_limiter_picks_backend() -> None:
    assert isinstance(make_rate_limiter(GatewaySettings(redis_url=None)), MemoryRateLimiter)
    # Connects lazily, so this needs no server.
    limiter = make_rate_limiter(GatewaySettings(redis_url=REDIS_URL))
    assert isinstance(limiter, RedisRateLimiter)
    asyncio.run(limiter.close())
