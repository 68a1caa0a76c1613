"""Build an engine for a catalog model: load it, size the engine to it, give it its KV pool."""

from __future__ import annotations

from dataclasses import replace

from edgefire.contract.catalog import ModelSpec
from edgefire.contract.errors import ModelUnavailableError
from edgefire.runtime.engine.llm_engine import EngineConfig, LLMEngine
from edgefire.runtime.loading.kv_namespace import kv_namespace
from edgefire.runtime.loading.load import load_lm
from edgefire.runtime.loading.loaded import LoadedLM
from edgefire.runtime.loading.parallel_layout import ParallelLayout
from edgefire.runtime.plugins import load_plugins


def create_engine(loaded: LoadedLM, config: EngineConfig) -> LLMEngine:
    """An engine over an already loaded model, its pool from the KV backend config names."""
    # A catalog entry may name its own KV backend (`kv_backend:`) over the node's.
    backend = loaded.spec.extra.get("kv_backend", config.kv_backend)
    layout = ParallelLayout.parse(loaded.spec.extra.get("parallel"), loaded.spec.id)
    if layout.world_size > 1:
        if backend != "local_paged":
            # A KV store's pages would hold only the root rank's heads.
            raise ModelUnavailableError(f"{loaded.spec.id}: a parallel layout keeps its KV in "
                                        f"local pages, not {backend!r}", field="model")
        strategy = load_plugins().parallel_strategies.get(layout.strategy)
        loaded = strategy.launch(loaded, layout, config.precision)
    config = replace(config, max_model_len=min(config.max_model_len, loaded.max_model_len),
                     kv_backend=backend,
                     kv_namespace=kv_namespace(loaded, config.block_size))
    # Looked up by name once, here: the engine never sees the plugin host.
    create_pool = load_plugins().kv_backends.get(config.kv_backend)
    return LLMEngine(loaded.model, loaded.tokenizer, config, loaded.vocab_size, create_pool)


def build_engine(spec: ModelSpec, config: EngineConfig) -> tuple[LLMEngine, LoadedLM]:
    loaded = load_lm(spec, config.precision)
    return create_engine(loaded, config), loaded
