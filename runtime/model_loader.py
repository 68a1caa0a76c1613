"""Build a runnable model and its tokenizer from a catalog spec, through the plugin registries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from edgefire.contract.catalog import ModelSpec
from edgefire.runtime.engine.model_runner import CausalLM
from edgefire.runtime.engine.precision import Precision
from edgefire.runtime.tokenizer import Tokenizer
from edgefire.runtime.weights.codec import WeightCodec


@dataclass(slots=True)
class LoadedModel:
    spec: ModelSpec
    model: CausalLM
    tokenizer: Tokenizer
    vocab_size: int
    max_model_len: int


class ModelLoader(Protocol):
    """What a model-architecture plugin registers."""

    def __call__(self, spec: ModelSpec, precision: Precision,
                 codec: WeightCodec) -> LoadedModel: ...


def load_model(spec: ModelSpec, precision: Precision) -> LoadedModel:
    """Load spec with its architecture's loader and its weight codec, both chosen by name."""
    from edgefire.runtime.plugins import load_plugins  # plugins import this module's LoadedModel

    host = load_plugins()
    loader: ModelLoader = host.models.get(spec.architecture)
    codec: WeightCodec = host.codecs.get(spec.codec)()
    return loader(spec, precision, codec)
