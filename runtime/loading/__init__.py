"""Model loading: catalog spec → model and tokenizer through the plugins, engines built on them.

The engine never imports this package: the builder here resolves what the engine needs from
plugins (the KV backend's pool factory) and passes it in.
"""

from edgefire.runtime.loading.builder import build_engine, create_engine
from edgefire.runtime.loading.load import load_encoder, load_lm, load_model
from edgefire.runtime.loading.loaded import LoadedEncoder, LoadedLM, ModelLoader

__all__ = ["LoadedEncoder", "LoadedLM", "ModelLoader", "build_engine", "create_engine",
           "load_encoder", "load_lm", "load_model"]
