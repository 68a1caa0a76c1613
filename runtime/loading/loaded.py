"""What loading a catalog model yields, one type per task, and what an architecture registers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from edgefire.contract.catalog import ModelSpec
from edgefire.runtime.engine.encoder import TextEncoder
from edgefire.runtime.engine.model_runner import CausalLM
from edgefire.runtime.engine.precision import Precision
from edgefire.runtime.tokenizer import Tokenizer
from edgefire.runtime.weights.codec import WeightCodec


@dataclass(slots=True)
class LoadedLM:
    """A text-generation model, ready for an LLMEngine."""

    spec: ModelSpec
    model: CausalLM
    tokenizer: Tokenizer
    vocab_size: int
    max_model_len: int


@dataclass(slots=True)
class LoadedEncoder:
    """A text-embeddings model: its encoder holds its own tokenizer, set up for truncation."""

    spec: ModelSpec
    encoder: TextEncoder


class ModelLoader(Protocol):
    """What a model-architecture plugin registers."""

    def __call__(self, spec: ModelSpec, precision: Precision,
                 codec: WeightCodec) -> LoadedLM | LoadedEncoder: ...
