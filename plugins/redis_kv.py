"""Built-in KV backend `redis`: the node's own page pool with a Redis store behind it.

Pages are plain keys under one prefix; the store keeps its own byte accounting (a hash of
page sizes, a total, and a sorted set by last use), so a cap evicts the least recently used
pages of this store alone whatever the server's `maxmemory` policy, and every page also has
a TTL. Both happen in one Lua script per write, atomically, so nodes sharing the store agree.
A page whose TTL ran out is still counted until it is evicted from the accounting: the store
then errs on the side of fewer bytes than the cap, never more.

Configured by environment: EDGEFIRE_REDIS_URL (default 127.0.0.1:6379), EDGEFIRE_KV_STORE_*
(the cap, TTL, timeout, key prefix and KV codec).
"""

from __future__ import annotations

import logging
import math
import time

import redis
import torch
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from redis.backoff import NoBackoff
from redis.retry import Retry

from edgefire.plugins.local_paged import create_local_paged_pool
from edgefire.runtime.engine.kv_pool import KVPool
from edgefire.runtime.engine.remote_kv.store import StoreUnavailable
from edgefire.runtime.plugins import hookimpl, load_plugins

log = logging.getLogger(__name__)

# redis-py wraps socket errors in its own, but OSError (TimeoutError included) stays as a net.
_FAULTS = (redis.RedisError, OSError)
COOLDOWN_S = 1.0  # after a fault the store is left alone this long: one timeout a second
GET_CHUNK = 64  # pages per round trip when reading: a miss ends the run early

# KEYS: page, LRU set, sizes, total. ARGV: record, ttl_s, now, cap_bytes. Returns evictions.
_PUT = """
local size = string.len(ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[3], KEYS[1])
redis.call('EXPIRE', KEYS[2], ARGV[2]); redis.call('EXPIRE', KEYS[3], ARGV[2])
redis.call('EXPIRE', KEYS[4], ARGV[2])
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('EXPIRE', KEYS[1], ARGV[2])
  return 0
end
local old = tonumber(redis.call('HGET', KEYS[3], KEYS[1]) or '0')
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
redis.call('HSET', KEYS[3], KEYS[1], size)
local total = redis.call('INCRBY', KEYS[4], size - old)
local evicted = 0
while total > tonumber(ARGV[4]) do
  local victim = redis.call('ZPOPMIN', KEYS[2])
  if #victim == 0 then break end
  local vsize = tonumber(redis.call('HGET', KEYS[3], victim[1]) or '0')
  redis.call('HDEL', KEYS[3], victim[1])
  redis.call('DEL', victim[1])
  total = redis.call('INCRBY', KEYS[4], -vsize)
  evicted = evicted + 1
end
return evicted
"""

# KEYS: pages. ARGV: LRU set, ttl_s, now. Refreshes the pages there are (TTL and last use);
# sent in the same round trip as the MGET that reads them (a script that returned the pages
# too would copy every one of them through Lua: twice the time, measured).
_TOUCH = """
for _, key in ipairs(KEYS) do
  if redis.call('EXPIRE', key, ARGV[2]) == 1 then
    redis.call('ZADD', ARGV[1], 'XX', ARGV[3], key)
  end
end
return 0
"""


class RedisKVSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EDGEFIRE_")

    redis_url: str = "redis://127.0.0.1:6379/0"
    kv_store_prefix: str = "edgefire:kv"
    kv_store_max_bytes: int = Field(1 << 30, gt=0)  # LRU eviction past this
    kv_store_ttl_s: int = Field(3600, gt=0)
    kv_store_timeout_s: float = Field(0.5, gt=0)
    kv_store_codec: str = "identity"  # a KV codec plugin's name (plugins/kv_codecs.py)


class RedisPageStore:
    name = "redis"

    def __init__(self, settings: RedisKVSettings | None = None) -> None:
        s = settings or RedisKVSettings()
        self.settings = s
        self.prefix = s.kv_store_prefix
        self._lru, self._sizes, self._total = (f"{s.kv_store_prefix}:{part}"
                                              for part in ("lru", "sizes", "bytes"))
        self._client = redis.Redis.from_url(
            s.redis_url, socket_connect_timeout=s.kv_store_timeout_s,
            socket_timeout=s.kv_store_timeout_s, retry=Retry(NoBackoff(), 0))
        self._put = self._client.register_script(_PUT)
        self._touch = self._client.register_script(_TOUCH)
        self._down_until = -math.inf
        self._logged_at = -math.inf

    def page_key(self, key: str) -> str:
        return f"{self.prefix}:page:{key}"

    def put_many(self, items: list[tuple[str, bytes]]) -> None:
        now = time.time()
        s = self.settings

        def put(pipe: redis.client.Pipeline) -> None:
            for key, record in items:
                self._put(keys=[self.page_key(key), self._lru, self._sizes, self._total],
                          args=[record, s.kv_store_ttl_s, now, s.kv_store_max_bytes],
                          client=pipe)

        self._guarded(self._pipelined, put)

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for start in range(0, len(keys), GET_CHUNK):
            chunk = [self.page_key(k) for k in keys[start:start + GET_CHUNK]]
            pages = self._guarded(self._read, chunk)
            out += pages
            if None in pages:
                break
        return out

    def ping(self) -> bool:
        try:
            return bool(self._client.ping())
        except _FAULTS:
            return False

    def close(self) -> None:
        self._client.close()

    def _read(self, keys: list[str]) -> list[bytes | None]:
        with self._client.pipeline(transaction=False) as pipe:
            pipe.mget(keys)
            self._touch(keys=keys, args=[self._lru, self.settings.kv_store_ttl_s, time.time()],
                        client=pipe)
            values, _ = pipe.execute()
        return [value or None for value in values]

    def _pipelined(self, fill) -> None:
        with self._client.pipeline(transaction=False) as pipe:
            fill(pipe)
            pipe.execute()

    def _guarded(self, call, *args, **kwargs):
        now = time.monotonic()
        if now < self._down_until:
            raise StoreUnavailable
        try:
            return call(*args, **kwargs)
        except _FAULTS as exc:
            self._down_until = now + COOLDOWN_S
            if now - self._logged_at >= 60:  # once a minute: an outage under load is one line
                self._logged_at = now
                log.warning("Redis KV store unavailable (%s: %s); serving from the local pool",
                            type(exc).__name__, exc)
            raise StoreUnavailable from exc


def create_redis_pool(num_blocks: int, block_size: int, cache_shape: tuple[int, ...],
                      dtype: torch.dtype, enable_prefix_caching: bool) -> KVPool:
    pool = create_local_paged_pool(num_blocks, block_size, cache_shape, dtype,
                                   enable_prefix_caching)
    settings = RedisKVSettings()
    pool.store = RedisPageStore(settings)
    pool.codec = load_plugins().kv_codecs.get(settings.kv_store_codec)()
    return pool


@hookimpl
def edgefire_register_kv_backends(register):
    register("redis", create_redis_pool)
