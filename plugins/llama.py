"""Built-in architecture: Llama-family decoders (SmolLM2, Llama 3.x) from GGUF or a bundle."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from edgefire.contract.catalog import ModelSpec
from edgefire.models.llama import LlamaConfig, LlamaForCausalLM, weights_from_gguf
from edgefire.plugins.identity_codec import IdentityCodec
from edgefire.runtime.engine.precision import Precision
from edgefire.runtime.loading import LoadedLM
from edgefire.runtime.plugins import hookimpl
from edgefire.runtime.tokenizer import load_gguf_tokenizer
from edgefire.runtime.weights import read_gguf, resolve_source
from edgefire.runtime.weights.bundle import is_bundle, read_bundle
from edgefire.runtime.weights.codec import WeightCodec, through_codec
from edgefire.runtime.weights.warm_cache import WarmCache, WarmEntry, cache_key


def load_llama_gguf(spec: ModelSpec, precision: Precision, codec: WeightCodec) -> LoadedLM:
    """Load from a compressed bundle (its own codec decodes it), else from the warm cache when
    it holds this model, else convert the GGUF and cache it."""
    path = resolve_source(spec.weights)
    if is_bundle(path):
        entry = read_bundle(path, spec.architecture, precision.dtypes)
    else:
        entry = _warm_or_convert(spec, path, precision.dtypes, codec)
    config = LlamaConfig(**entry.model_meta["config"])
    model = LlamaForCausalLM(config, entry.weights, precision.dtypes, precision.kv)
    to_resident = getattr(codec, "to_resident", None)
    if to_resident is not None:  # the codec keeps its packed or quantized form resident
        model.make_resident(to_resident, codec.precision,
                            getattr(codec, "to_resident_embedding", None))
    max_len = min(config.max_position, spec.context_window)
    return LoadedLM(spec, model, entry.tokenizer, config.vocab_size, max_len)


def export_llama(spec: ModelSpec) -> WarmEntry:
    """The BF16 weights a bfloat16 load builds, for `edgefire compress`: taken from the warm
    cache when such a load left them there, else converted (and not cached: the bundle is the
    point, not a second uncompressed copy)."""
    path, dtypes, codec = resolve_source(spec.weights), (torch.bfloat16,), IdentityCodec()
    cached = WarmCache().load(cache_key(spec, path, codec.name, dtypes))
    return cached or _convert_gguf(path, dtypes, codec)


def _warm_or_convert(spec: ModelSpec, path: Path, dtypes: tuple[torch.dtype, ...],
                     codec: WeightCodec) -> WarmEntry:
    cache = WarmCache()
    key = cache_key(spec, path, codec.name, dtypes)
    entry = cache.load(key)
    if entry is None:
        entry = _convert_gguf(path, dtypes, codec)
        cache.store(key, entry)
    return entry


def _convert_gguf(path: Path, dtypes: tuple[torch.dtype, ...], codec: WeightCodec) -> WarmEntry:
    """Dequantize and fuse the GGUF's weights into each compute dtype; build its tokenizer."""
    gguf_file = read_gguf(path)
    config = LlamaConfig.from_gguf_fields(gguf_file.field)
    tensors = through_codec(gguf_file.tensors(torch.float32), codec)
    weights = weights_from_gguf(config, tensors)
    config = dataclasses.replace(config, tie_embeddings="lm_head" not in weights)
    per_dtype = {dtype: {name: w.to(dtype) for name, w in weights.items()} for dtype in dtypes}
    return WarmEntry(per_dtype, load_gguf_tokenizer(gguf_file.reader),
                     {"config": dataclasses.asdict(config)})


@hookimpl
def edgefire_register_models(register):
    register("llama", load_llama_gguf)


@hookimpl
def edgefire_register_exporters(register):
    register("llama", export_llama)
