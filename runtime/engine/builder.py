"""Build an engine for a catalog model: load it through its plugins, size the engine to it."""

from __future__ import annotations

from dataclasses import replace

from edgefire.contract.catalog import ModelSpec
from edgefire.runtime.engine.llm_engine import EngineConfig, LLMEngine
from edgefire.runtime.model_loader import LoadedModel, load_model


def build_engine(spec: ModelSpec, config: EngineConfig) -> tuple[LLMEngine, LoadedModel]:
    loaded = load_model(spec, config.precision)
    config = replace(config, max_model_len=min(config.max_model_len, loaded.max_model_len))
    return LLMEngine(loaded.model, loaded.tokenizer, config, loaded.vocab_size), loaded
