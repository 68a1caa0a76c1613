"""Model registry: single-flight loads, LRU eviction within the budget, never while in use."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

import pytest

from edgefire.contract.catalog import Catalog, ModelSpec
from edgefire.contract.errors import CapacityError, ModelUnavailableError, UnknownModelError
from edgefire.runtime.node.model_registry import ModelRegistry

# A small Llama config; its memory need is the capacity planner's (ModelSpec.need_bytes).
CONFIG = {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2,
          "head_dim": 16, "intermediate_size": 128, "vocab_size": 256, "weight_dtype": "bf16"}


def _spec(model_id: str, vocab_size: int = 256, runnable: bool = True) -> ModelSpec:
    return ModelSpec(id=model_id, task="text-generation", architecture="llama", weights="w",
                     context_window=64, aliases=(f"{model_id}-alias",), runnable=runnable,
                     extra={"config": {**CONFIG, "vocab_size": vocab_size}})


NEED = _spec("a").need_bytes  # what a, b and c each need


@dataclass
class FakeModel:
    spec: ModelSpec
    memory_bytes: int
    closed: bool = False
    dead: bool = False
    failed_lately: bool = False

    @property
    def degraded(self) -> bool:
        return self.dead or self.failed_lately

    def mark_degraded(self) -> None:
        self.failed_lately = True

    def close(self) -> None:
        self.closed = True


class Builder:
    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, spec: ModelSpec) -> FakeModel:
        with self.lock:
            self.calls.append(spec.id)
        time.sleep(self.delay)
        return FakeModel(spec, spec.need_bytes)


def _registry(budget_needs: float, builder: Builder) -> ModelRegistry:
    """A registry whose budget holds budget_needs times what a, b or c needs."""
    catalog = Catalog([_spec("a"), _spec("b"), _spec("c"), _spec("big", vocab_size=1 << 22),
                       _spec("plan", runnable=False)])
    return ModelRegistry(catalog, int(budget_needs * NEED), builder)


def test_the_fake_catalog_sizes_are_what_the_tests_assume():
    assert _spec("big", vocab_size=1 << 22).need_bytes > 2.5 * NEED > 2 * NEED > 0


async def _use(registry: ModelRegistry, name: str) -> FakeModel:
    async with registry.use(name) as model:
        return model


def test_concurrent_first_requests_share_one_load():
    builder = Builder(delay=0.2)
    registry = _registry(2.5, builder)

    async def main():
        return await asyncio.gather(*(_use(registry, "a") for _ in range(5)),
                                    _use(registry, "a-alias"))

    models = asyncio.run(main())
    assert builder.calls == ["a"] and registry.num_loads == 1
    assert all(m is models[0] for m in models)


def test_least_recently_used_idle_model_is_evicted():
    builder = Builder()
    registry = _registry(2.5, builder)

    async def main():
        a = await _use(registry, "a")
        await _use(registry, "b")
        await _use(registry, "a")  # b is now the least recently used
        await _use(registry, "c")
        return a

    a = asyncio.run(main())
    assert set(registry.loaded()) == {"a", "c"} and registry.num_evictions == 1
    assert not a.closed


def test_a_model_in_use_is_never_evicted():
    registry = _registry(2.5, Builder())

    async def main():
        async with registry.use("a"), registry.use("b"):
            with pytest.raises(CapacityError):
                await _use(registry, "c")
        assert set(registry.loaded()) == {"a", "b"}
        await _use(registry, "c")  # both idle now: one of them makes room

    asyncio.run(main())
    assert len(registry.loaded()) == 2 and "c" in registry.loaded()


def test_a_model_larger_than_the_budget_is_refused():
    registry = _registry(2.5, Builder())
    with pytest.raises(CapacityError, match="budget"):
        asyncio.run(_use(registry, "big"))


def test_unknown_and_planning_only_models_raise_typed_errors():
    registry = _registry(2.5, Builder())
    with pytest.raises(UnknownModelError):
        asyncio.run(_use(registry, "nope"))
    with pytest.raises(ModelUnavailableError):
        asyncio.run(_use(registry, "plan"))


def test_a_dead_model_is_dropped_and_loaded_again_by_the_next_request():
    builder = Builder()
    registry = _registry(2.5, builder)

    async def main():
        first = await _use(registry, "a")
        await _use(registry, "b")
        assert registry.degraded() == []
        first.dead = True
        assert registry.degraded() == ["a"]  # dead, not yet rebuilt
        assert await _use(registry, "b") is not first  # other models are untouched
        second = await _use(registry, "a")
        assert second is not first and first.closed and not second.closed
        assert builder.calls == ["a", "b", "a"] and registry.num_loads == 3
        # The new one is degraded until it has worked (its engine clears that).
        assert second.failed_lately and registry.degraded() == ["a"]
        second.failed_lately = False
        assert registry.degraded() == []
        assert await _use(registry, "a") is second

    asyncio.run(main())


def test_a_dead_model_that_fails_to_load_again_keeps_the_node_degraded():
    registry = _registry(2.5, Builder())

    async def main():
        (await _use(registry, "a")).dead = True
        registry._build = _failing_build
        with pytest.raises(RuntimeError):
            await _use(registry, "a")
        assert registry.degraded() == ["a"] and "a" not in registry.loaded()
        registry._build = Builder()
        assert (await _use(registry, "a")).failed_lately

    asyncio.run(main())


def test_an_evicted_dead_model_is_simply_gone():
    registry = _registry(2, Builder())

    async def main():
        (await _use(registry, "a")).dead = True
        await _use(registry, "b")
        await _use(registry, "c")  # evicts a, the least recently used
        assert "a" not in registry.loaded() and registry.degraded() == []

    asyncio.run(main())


def _failing_build(spec: ModelSpec) -> FakeModel:
    raise RuntimeError("load failed")
