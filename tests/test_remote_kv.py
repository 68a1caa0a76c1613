"""The `redis` KV backend on the real Redis server: page records, the store's cap and TTL, and
engines that reuse each other's prefix pages (tiny float32 Llama, so outputs compare exactly)."""

from __future__ import annotations

import dataclasses
import time

import pytest
import redis
import torch

from edgefire.models.llama import LlamaForCausalLM
from edgefire.plugins.kv_codecs import BF16PlanesCodec
from edgefire.plugins.local_paged import create_local_paged_pool
from edgefire.plugins.redis_kv import RedisKVSettings, RedisPageStore
from edgefire.runtime import EngineConfig, SamplingParams
from edgefire.runtime.engine.kv_pool import KVPool
from edgefire.runtime.engine.llm_engine import LLMEngine
from edgefire.runtime.engine.remote_kv.codec import IDENTITY, KVCodec
from edgefire.runtime.engine.remote_kv.page_format import (
    PageFormatError,
    PageLayout,
    pack,
    unpack,
)
from edgefire.runtime.engine.remote_kv.store import StoreUnavailable
from tests.redis_support import REDIS_URL, needs_redis
from tests.test_fused_decode import CONFIG, _weights

pytestmark = needs_redis
PROMPT = list(range(10, 60))  # 50 tokens: 12 full blocks of 4 a prefix hit may cover
LAYOUT = PageLayout(torch.bfloat16, (3, 2, 2, 4, 16))


def _settings(prefix: str, **overrides) -> RedisKVSettings:
    return RedisKVSettings(redis_url=REDIS_URL, kv_store_prefix=prefix.rstrip(":"),
                           kv_store_timeout_s=5.0, **overrides)


def test_a_record_round_trips_and_any_damage_is_refused():
    page = torch.randn(LAYOUT.shape).to(torch.bfloat16)
    payload = page.view(torch.int16).numpy().tobytes()
    record = pack(LAYOUT, b"h" * 32, payload)
    codec, back = unpack(record, LAYOUT, b"h" * 32)
    assert codec == "identity" and bytes(back) == payload
    flipped = bytearray(record)
    flipped[-7] ^= 0x10
    for bad, why in [(record[:-1], "payload is"), (record[:20], "truncated"),
                     (bytes(flipped), "checksum"), (b"XXXX" + record[4:], "format")]:
        with pytest.raises(PageFormatError, match=why):
            unpack(bad, LAYOUT, b"h" * 32)
    with pytest.raises(PageFormatError, match="another block"):
        unpack(record, LAYOUT, b"g" * 32)
    other = dataclasses.replace(LAYOUT, dtype=torch.float32)
    with pytest.raises(PageFormatError, match="another dtype"):
        unpack(record, other, b"h" * 32)


def test_store_round_trips_bytes_and_evicts_least_recently_used_under_its_cap(redis_prefix):
    record = bytes(range(256)) * 40  # 10,240 bytes
    store = RedisPageStore(_settings(redis_prefix, kv_store_max_bytes=3 * len(record) + 100,
                                     kv_store_ttl_s=600))
    store.put_many([(k, record) for k in ("a", "b", "c")])
    assert store.get_many(["a", "b", "c"]) == [record] * 3
    time.sleep(0.01)
    store.get_many(["a"])  # a is now the most recently used
    store.put_many([("d", record)])  # over the cap: b, the least recently used, goes
    assert store.get_many(["b"]) == [None]
    assert store.get_many(["a", "c", "d"]) == [record] * 3
    with redis.Redis.from_url(REDIS_URL) as client:
        assert int(client.get(f"{store.prefix}:bytes")) == 3 * len(record)
        assert 0 < client.ttl(store.page_key("a")) <= 600
    assert store.get_many(["a", "zz", "c"]) == [record, None, record]


def test_an_unreachable_store_fails_fast_and_then_cools_down():
    store = RedisPageStore(RedisKVSettings(redis_url="redis://127.0.0.1:1/0",
                                           kv_store_timeout_s=0.2))
    with pytest.raises(StoreUnavailable):
        store.put_many([("a", b"x")])
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        store.get_many(["a"])  # within the cool-down: not even tried
    assert time.monotonic() - started < 0.05
    assert store.ping() is False


def _engine(tokenizer, prefix: str | None, namespace: str = "tiny",
            kv_dtype: torch.dtype | None = None, codec: KVCodec = IDENTITY) -> LLMEngine:
    def pool(*args) -> KVPool:
        pool = create_local_paged_pool(*args)
        if prefix is not None:
            pool.store = RedisPageStore(_settings(prefix))
            pool.codec = codec
        return pool

    model = LlamaForCausalLM(CONFIG, _weights(), (torch.float32,), kv_dtype=kv_dtype)
    config = EngineConfig(max_model_len=CONFIG.max_position, block_size=4, kv_cache_bytes=1 << 22,
                          dtype="float32", kv_namespace=namespace)
    return LLMEngine(model, tokenizer, config, CONFIG.vocab_size, pool)


def _generate(engine: LLMEngine, prompt: list[int], salt: bytes = b"acct") -> tuple[list[int], int]:
    """Greedy tokens and cached prompt tokens, the remote lookup done as a node does it."""
    seq = engine.prepare("r", prompt, SamplingParams(temperature=0.0, max_tokens=8,
                                                     ignore_eos=True), salt)
    engine.install_pages(engine.lookup_remote(seq))
    engine.enqueue(seq)
    out: list[int] = []
    while engine.has_unfinished():
        for output in engine.step():
            out += output.token_ids
    return out, seq.num_cached_tokens


def test_a_second_engine_reuses_the_first_ones_pages_with_identical_output(tokenizer,
                                                                           redis_prefix):
    reference, _ = _generate(_engine(tokenizer, None), PROMPT)
    first = _engine(tokenizer, redis_prefix)
    assert _generate(first, PROMPT) == (reference, 0)
    assert first.remote.flush(10)
    assert first.remote.stats.num_pages_written == (len(PROMPT) + 8) // 4
    second = _engine(tokenizer, redis_prefix)
    assert _generate(second, PROMPT) == (reference, 48)
    stats = second.stats()
    assert stats.num_prefix_remote_hit_tokens == stats.num_prefix_hit_tokens == 48
    # The pages now live in the second pool: a third request hits them locally.
    assert _generate(second, PROMPT) == (reference, 48)
    assert second.stats().num_prefix_remote_hit_tokens == 48
    # The reused pages are bit for bit what the first engine computed.
    hashes = second.prefix_hashes(second.prepare("probe", PROMPT, SamplingParams(), b"acct"))
    assert len(hashes) == 12
    for h in hashes:
        assert torch.equal(second.runner.kv_cache[:, :, :, second.blocks.cached[h]],
                           first.runner.kv_cache[:, :, :, first.blocks.cached[h]])


def test_pages_of_another_account_or_model_are_never_read(tokenizer, redis_prefix):
    first = _engine(tokenizer, redis_prefix)
    _generate(first, PROMPT, salt=b"acct")
    assert first.remote.flush(10)
    assert _generate(_engine(tokenizer, redis_prefix), PROMPT, salt=b"other")[1] == 0
    assert _generate(_engine(tokenizer, redis_prefix, namespace="other-model"), PROMPT)[1] == 0


def test_a_damaged_page_is_refused_and_recomputed(tokenizer, redis_prefix):
    reference, _ = _generate(_engine(tokenizer, None), PROMPT)
    first = _engine(tokenizer, redis_prefix)
    _generate(first, PROMPT)
    assert first.remote.flush(10)
    seq = first.prepare("probe", PROMPT, SamplingParams(), b"acct")
    hashes = first.prefix_hashes(seq)
    store = first.remote.store
    with redis.Redis.from_url(REDIS_URL) as client:
        key = store.page_key(first.remote.key(hashes[5]))
        record = bytearray(client.get(key))
        record[-3] ^= 0xFF
        client.set(key, bytes(record))
        client.set(store.page_key(first.remote.key(hashes[8])), b"truncated")
    second = _engine(tokenizer, redis_prefix)
    assert _generate(second, PROMPT) == (reference, 5 * 4)  # blocks 0-4 reused, 5 on computed
    assert second.remote.stats.num_pages_rejected == 1


def test_an_unreachable_store_costs_only_the_reuse(tokenizer):
    reference, _ = _generate(_engine(tokenizer, None), PROMPT)
    engine = _engine(tokenizer, None)
    store = RedisPageStore(RedisKVSettings(redis_url="redis://127.0.0.1:1/0",
                                           kv_store_timeout_s=0.2))
    engine = LLMEngine(engine.runner.model, tokenizer, engine.config, CONFIG.vocab_size,
                       lambda *args: dataclasses.replace(create_local_paged_pool(*args),
                                                         store=store))
    assert _generate(engine, PROMPT) == (reference, 0)
    assert engine.remote.flush(10)
    assert engine.remote.stats.num_pages_dropped > 0
    assert engine.remote.available is False


def test_the_bf16_planes_codec_is_lossless_and_smaller():
    codec = BF16PlanesCodec()
    page = (torch.randn(LAYOUT.shape) * 0.5).to(torch.bfloat16)
    raw = memoryview(page.view(torch.int16).numpy()).cast("B")
    data = bytes(codec.encode(raw, LAYOUT))
    assert len(data) < 0.85 * len(raw)
    assert codec.decode(memoryview(data), LAYOUT) == bytearray(raw)
    for bad in (data[:-5], b"\x05\x00\x00\x00garbage", b"\x01"):
        with pytest.raises(ValueError):
            codec.decode(memoryview(bad), LAYOUT)
    f32 = dataclasses.replace(LAYOUT, dtype=torch.float32)
    raw32 = memoryview(torch.randn(f32.shape).numpy()).cast("B")
    assert codec.decode(memoryview(bytes(codec.encode(raw32, f32))), f32) == bytearray(raw32)


def test_pages_through_a_codec_are_reused_and_another_codec_refuses_them(tokenizer,
                                                                        redis_prefix):
    bf16 = torch.bfloat16
    reference, _ = _generate(_engine(tokenizer, None, kv_dtype=bf16), PROMPT)
    first = _engine(tokenizer, redis_prefix, kv_dtype=bf16, codec=BF16PlanesCodec())
    _generate(first, PROMPT)
    assert first.remote.flush(10)
    stats = first.remote.stats
    assert stats.num_bytes_written < stats.num_pages_written * first.page_layout.num_bytes
    second = _engine(tokenizer, redis_prefix, kv_dtype=bf16, codec=BF16PlanesCodec())
    assert _generate(second, PROMPT) == (reference, 48)
    plain = _engine(tokenizer, redis_prefix, kv_dtype=bf16)
    assert _generate(plain, PROMPT) == (reference, 0)
    assert plain.remote.stats.num_pages_rejected == 1
