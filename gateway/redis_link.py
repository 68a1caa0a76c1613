"""Redis as the gateway uses it: short timeouts, no retries, faults that degrade, and health.

The cache and the rate limiter each hold a client from `connect` and a `RedisGuard`. A fault
(refused, reset, or no reply within the timeout) makes the cache read a miss and the limiter
follow its fail-open/fail-closed setting; it never becomes a 500.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Literal, ParamSpec, TypeVar

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

log = logging.getLogger(__name__)

# redis-py wraps socket errors in its own, but OSError (TimeoutError included) stays as a net.
REDIS_FAULTS = (redis.RedisError, OSError)
# After a fault, Redis is left alone this long: a dead or silent server then costs one timeout
# per second per user, not one per request.
COOLDOWN_S = 1.0
FAULT_LOG_INTERVAL_S = 60.0
HEALTH_TTL_S = 1.0

RedisState = Literal["ok", "unreachable", "disabled"]
P = ParamSpec("P")
T = TypeVar("T")


class RedisUnavailable(Exception):
    """Redis failed, or failed less than COOLDOWN_S ago; the caller degrades."""


def connect(url: str, timeout_s: float) -> aioredis.Redis:
    """A client whose connect and every reply take at most `timeout_s`, and that never retries
    (each retry would multiply the wait on a silent server)."""
    return aioredis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s,
                             retry=Retry(NoBackoff(), 0))


class RedisGuard:
    """The fault state of one Redis user (`what` names it in the log)."""

    def __init__(self, what: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._what = what
        self._clock = clock
        self._down_until = -math.inf
        self._logged_at = -math.inf

    async def run(self, call: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """`call(*args, **kwargs)`, or RedisUnavailable if it fails or Redis is cooling down."""
        now = self._clock()
        if now < self._down_until:
            raise RedisUnavailable
        try:
            return await call(*args, **kwargs)
        except REDIS_FAULTS as exc:
            self._down_until = now + COOLDOWN_S
            # Once a minute at most: an outage under load would otherwise log every request.
            if now - self._logged_at >= FAULT_LOG_INTERVAL_S:
                self._logged_at = now
                log.warning("Redis unavailable for the %s (%s: %s); degrading until it answers",
                            self._what, type(exc).__name__, exc)
            raise RedisUnavailable from exc


class RedisHealth:
    """Redis's state for /health: one PING bounded by the timeout, remembered HEALTH_TTL_S so
    that /health stays cheap however often it is polled."""

    def __init__(self, url: str, timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._redis = connect(url, timeout_s)
        self._timeout_s = timeout_s
        self._clock = clock
        self._state: RedisState = "unreachable"
        self._checked_at = -math.inf
        self._lock = asyncio.Lock()  # concurrent /health calls share one PING

    async def state(self) -> RedisState:
        async with self._lock:
            if self._clock() - self._checked_at >= HEALTH_TTL_S:
                self._state = await self._ping()
                self._checked_at = self._clock()
            return self._state

    async def _ping(self) -> RedisState:
        try:
            # Connect and reply are each bounded; this bounds the pair, whatever redis-py does.
            async with asyncio.timeout(2 * self._timeout_s):
                await self._redis.ping()
        except REDIS_FAULTS:
            return "unreachable"
        return "ok"

    async def close(self) -> None:
        await self._redis.aclose()
