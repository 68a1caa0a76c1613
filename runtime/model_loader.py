"""Build a runnable model and its tokenizer from a catalog spec."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from models.llama import LlamaConfig, LlamaForCausalLM, weights_from_gguf
from runtime.catalog import ModelSpec
from runtime.engine.precision import Precision
from runtime.errors import ModelUnavailableError
from runtime.tokenizer import Tokenizer, load_gguf_tokenizer
from runtime.weights import read_gguf, resolve_source


@dataclass(slots=True)
class LoadedModel:
    spec: ModelSpec
    model: LlamaForCausalLM
    tokenizer: Tokenizer
    vocab_size: int
    max_model_len: int


def load_text_model(spec: ModelSpec, precision: Precision) -> LoadedModel:
    if spec.architecture != "llama":
        raise ModelUnavailableError(f"architecture {spec.architecture!r} cannot generate text yet",
                                    field="model")
    gguf_file = read_gguf(resolve_source(spec.weights))
    config = LlamaConfig.from_gguf_fields(gguf_file.field)
    weights = weights_from_gguf(config, gguf_file.tensors(torch.float32))
    config = dataclasses.replace(config, tie_embeddings="lm_head" not in weights)
    model = LlamaForCausalLM(config, weights, precision.dtypes, precision.kv)
    tokenizer = load_gguf_tokenizer(gguf_file.reader)
    max_len = min(config.max_position, spec.context_window)
    return LoadedModel(spec, model, tokenizer, config.vocab_size, max_len)
