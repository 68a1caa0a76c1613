"""Built-in architecture: Llama-family decoders loaded from GGUF (SmolLM2, Llama 3.x)."""

from __future__ import annotations

import dataclasses

import torch

from models.llama import LlamaConfig, LlamaForCausalLM, weights_from_gguf
from runtime.catalog import ModelSpec
from runtime.engine.precision import Precision
from runtime.model_loader import LoadedModel
from runtime.plugins import hookimpl
from runtime.tokenizer import load_gguf_tokenizer
from runtime.weights import read_gguf, resolve_source
from runtime.weights.codec import WeightCodec, through_codec


def load_llama_gguf(spec: ModelSpec, precision: Precision, codec: WeightCodec) -> LoadedModel:
    gguf_file = read_gguf(resolve_source(spec.weights))
    config = LlamaConfig.from_gguf_fields(gguf_file.field)
    tensors = through_codec(gguf_file.tensors(torch.float32), codec)
    weights = weights_from_gguf(config, tensors)
    config = dataclasses.replace(config, tie_embeddings="lm_head" not in weights)
    model = LlamaForCausalLM(config, weights, precision.dtypes, precision.kv)
    tokenizer = load_gguf_tokenizer(gguf_file.reader)
    max_len = min(config.max_position, spec.context_window)
    return LoadedModel(spec, model, tokenizer, config.vocab_size, max_len)


@hookimpl
def edgefire_register_models(register):
    register("llama", load_llama_gguf)
