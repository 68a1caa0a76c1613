"""Load a catalog model through the plugin registries: its architecture's loader, its codec."""

from __future__ import annotations

from typing import TypeVar

from edgefire.contract.catalog import ModelSpec
from edgefire.runtime.engine.precision import Precision
from edgefire.runtime.loading.loaded import LoadedEncoder, LoadedLM, ModelLoader
from edgefire.runtime.plugins import load_plugins
from edgefire.runtime.weights.codec import WeightCodec

_Loaded = TypeVar("_Loaded", LoadedLM, LoadedEncoder)


def load_model(spec: ModelSpec, precision: Precision) -> LoadedLM | LoadedEncoder:
    """Load spec with its architecture's loader and its weight codec, both chosen by name."""
    host = load_plugins()
    loader: ModelLoader = host.models.get(spec.architecture)
    codec: WeightCodec = host.codecs.get(spec.codec)()
    return loader(spec, precision, codec)


def load_lm(spec: ModelSpec, precision: Precision) -> LoadedLM:
    return _expect(load_model(spec, precision), LoadedLM, spec)


def load_encoder(spec: ModelSpec, precision: Precision) -> LoadedEncoder:
    return _expect(load_model(spec, precision), LoadedEncoder, spec)


def _expect(loaded: LoadedLM | LoadedEncoder, kind: type[_Loaded], spec: ModelSpec) -> _Loaded:
    # A catalog entry whose task does not match its architecture: a catalog bug, not a user's.
    if not isinstance(loaded, kind):
        raise TypeError(f"{spec.id}: architecture {spec.architecture!r} loads a "
                        f"{type(loaded).__name__}, not the {kind.__name__} its task needs")
    return loaded
