"""AI Gateway rate limiting: fixed (calendar) and exact sliding windows, in memory or Redis."""

from __future__ import annotations

import math
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from edgefire.contract.errors import RateLimitUnavailableError
from edgefire.gateway.redis_link import RedisGuard, RedisUnavailable, connect
from edgefire.gateway.settings import GatewaySettings

TECHNIQUES = ("fixed", "sliding")


@dataclass(slots=True)
class RateDecision:
    """The outcome of one hit: whether it may proceed, the hits left in the current window,
    and, when refused, the seconds until a hit could succeed (0 when allowed)."""

    allowed: bool
    limit: int
    remaining: int
    retry_after_s: float


class RateLimiter(Protocol):
    async def hit(self, key: str, limit: int, interval_s: int, technique: str) -> RateDecision:
        ...

    async def close(self) -> None: ...


def _check(limit: int, interval_s: int, technique: str) -> None:
    if limit < 1 or interval_s < 1:
        raise ValueError(f"rate limit needs limit >= 1 and interval >= 1 s, "
                         f"got {limit} per {interval_s} s")
    if technique not in TECHNIQUES:
        raise ValueError(f"unknown rate limiting technique {technique!r}")


def _fixed_decision(count: int, limit: int, now: float, window_end: float) -> RateDecision:
    # Refused hits count too (they are harmless: the window resets regardless).
    allowed = count <= limit
    return RateDecision(allowed=allowed, limit=limit, remaining=max(0, limit - count),
                        retry_after_s=0.0 if allowed else window_end - now)


class MemoryRateLimiter:
    """Per-process limits. `hit` never awaits, so concurrent tasks cannot interleave in it."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        # Only the current window's count is kept per key, and a sliding log never holds more
        # than `limit` stamps, so memory stays proportional to the number of keys.
        self._fixed: dict[str, tuple[tuple[int, int], int]] = {}
        self._sliding: dict[str, deque[float]] = {}

    async def hit(self, key: str, limit: int, interval_s: int, technique: str) -> RateDecision:
        _check(limit, interval_s, technique)
        now = self._clock()
        if technique == "fixed":
            window = math.floor(now / interval_s)
            # The interval is part of the window's identity, so reconfiguring a gateway
            # cannot carry a count over into an unrelated window with the same index.
            window_id = (interval_s, window)
            seen_id, count = self._fixed.get(key, (window_id, 0))
            count = count + 1 if seen_id == window_id else 1
            self._fixed[key] = (window_id, count)
            return _fixed_decision(count, limit, now, (window + 1) * interval_s)

        stamps = self._sliding.setdefault(key, deque())
        # The window is (now - interval, now]: a hit exactly one interval old has left it.
        while stamps and stamps[0] <= now - interval_s:
            stamps.popleft()
        if len(stamps) < limit:
            stamps.append(now)
            return RateDecision(True, limit, limit - len(stamps), 0.0)
        # After a limit is lowered the log can hold more than `limit` stamps; a hit succeeds
        # once all but `limit - 1` of them have aged out.
        return RateDecision(False, limit, 0, stamps[len(stamps) - limit] + interval_s - now)

    async def close(self) -> None:
        self._fixed.clear()
        self._sliding.clear()


# KEYS[1] = the window's counter; ARGV[1] = ms until the window ends.
_FIXED_LUA = """
local count = redis.call('INCR', KEYS[1])
if count == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return count
"""

# KEYS[1] = sorted set of allowed hits scored by time; ARGV = now, cutoff (now - interval),
# limit, unique member, ms to keep the log. Returns {allowed, count, score or false}, the score
# being that of the hit whose expiry lets a new one in (the oldest unless the limit was lowered).
# Refused hits are not logged, or a client retrying too early would push its own wait back.
_SLIDING_LUA = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
local count = redis.call('ZCARD', KEYS[1])
if count < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], ARGV[1], ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return {1, count + 1, false}
end
local surplus = count - tonumber(ARGV[3])
local blocker = redis.call('ZRANGE', KEYS[1], surplus, surplus, 'WITHSCORES')
return {0, count, blocker[2]}
"""


class RedisRateLimiter:
    """Limits shared by every gateway process on one Redis; each hit is one atomic Lua script.

    Times come from `clock` (the client's), not Redis's, so all processes must share a clock
    (true on one host; NTP-close across hosts) and tests can drive it. While Redis fails
    (see edgefire.gateway.redis_link), `on_error` decides: "open" allows every hit, "closed" raises
    RateLimitUnavailableError.
    """

    def __init__(self, url: str, prefix: str = "edgefire:rl:",
                 clock: Callable[[], float] = time.time, *,
                 on_error: Literal["open", "closed"] = "open", timeout_s: float = 0.5) -> None:
        self._redis = connect(url, timeout_s)
        self._guard = RedisGuard("rate limiter")
        self._prefix = prefix
        self._clock = clock
        self._on_error = on_error
        self._fixed = self._redis.register_script(_FIXED_LUA)
        self._sliding = self._redis.register_script(_SLIDING_LUA)

    async def hit(self, key: str, limit: int, interval_s: int, technique: str) -> RateDecision:
        _check(limit, interval_s, technique)
        try:
            return await self._hit(key, limit, interval_s, technique)
        except RedisUnavailable:
            if self._on_error == "closed":
                raise RateLimitUnavailableError(
                    "Rate limit cannot be checked right now (its store is unavailable) and "
                    "this gateway refuses requests it cannot count; retry shortly") from None
            # The count is unknown; the hit is let through as if the window were empty.
            return RateDecision(True, limit, limit, 0.0)

    async def _hit(self, key: str, limit: int, interval_s: int, technique: str) -> RateDecision:
        now = self._clock()
        if technique == "fixed":
            window = math.floor(now / interval_s)
            window_end = (window + 1) * interval_s
            count = await self._guard.run(
                self._fixed, keys=[f"{self._prefix}fixed:{key}:{interval_s}:{window}"],
                args=[max(1, math.ceil((window_end - now) * 1000))])
            return _fixed_decision(int(count), limit, now, window_end)

        allowed, count, blocker = await self._guard.run(
            self._sliding, keys=[f"{self._prefix}sliding:{key}"],
            args=[repr(now), repr(now - interval_s), limit, uuid.uuid4().hex,
                  interval_s * 1000])
        if allowed:
            return RateDecision(True, limit, max(0, limit - int(count)), 0.0)
        return RateDecision(False, limit, 0, max(0.0, float(blocker) + interval_s - now))

    async def close(self) -> None:
        await self._redis.aclose()


def make_rate_limiter(settings: GatewaySettings) -> RateLimiter:
    if settings.redis_url:
        return RedisRateLimiter(settings.redis_url, on_error=settings.rate_limit_on_redis_error,
                                timeout_s=settings.redis_timeout_s)
    return MemoryRateLimiter()
