"""What the Redis-backed tests share: the server's URL, a skip marker, a controllable clock."""

from __future__ import annotations

import os

import pytest
import redis

REDIS_URL = os.environ.get("EDGEFIRE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
# The gateway's default Redis timeout (0.5 s) is for serving; tests of what the backends compute
# give Redis longer, so that fifty connects at once on a loaded 2-core machine are not read as
# a dead Redis (the limiter then degrades open and the count is wrong).
TIMEOUT_S = 5.0


def _redis_reachable() -> bool:
    try:
        with redis.Redis.from_url(REDIS_URL, socket_connect_timeout=0.5) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False


needs_redis = pytest.mark.skipif(not _redis_reachable(),
                                 reason=f"no Redis server reachable at {REDIS_URL}")


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
