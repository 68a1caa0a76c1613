"""Built-in architecture: BERT-style sentence encoders from a sentence-transformers folder."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file
from tokenizers import Tokenizer

from edgefire.contract.catalog import ModelSpec
from edgefire.contract.errors import WeightsNotFoundError
from edgefire.models.bert import BertConfig, BertEncoder, weights_from_checkpoint
from edgefire.runtime.engine.encoder import TextEncoder
from edgefire.runtime.engine.precision import Precision
from edgefire.runtime.loading import LoadedEncoder
from edgefire.runtime.plugins import hookimpl
from edgefire.runtime.weight_precision import EMBEDDING_DTYPE
from edgefire.runtime.weights import resolve_source
from edgefire.runtime.weights.codec import WeightCodec, through_codec

# sentence-transformers' own default when a folder has no sentence_bert_config.json.
_DEFAULT_MAX_SEQ_LENGTH = 512


def load_bert(spec: ModelSpec, precision: Precision, codec: WeightCodec) -> LoadedEncoder:
    folder = resolve_source(spec.weights)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if not (folder / name).is_file():
            raise WeightsNotFoundError(f"{spec.id}: {folder} has no {name}")
    config = BertConfig.from_json(folder / "config.json")
    _check_pooling(spec, folder, config)
    tensors = through_codec(load_file(folder / "model.safetensors").items(), codec)
    # Embeddings are computed in EMBEDDING_DTYPE (float32) whatever `precision` says: bfloat16
    # moved vectors by up to ~6e-5 in cosine distance on sample sentences, most of the 1e-4
    # parity budget with the reference model, and vectors are stored and compared long after
    # they are made. The model is small (~90 MB in float32), so bfloat16's bandwidth saving
    # buys little.
    dtype = EMBEDDING_DTYPE
    encoder = BertEncoder(config, weights_from_checkpoint(config, tensors, dtype), dtype)
    st_config = folder / "sentence_bert_config.json"
    max_seq = (json.loads(st_config.read_text()).get("max_seq_length")
               if st_config.is_file() else None) or _DEFAULT_MAX_SEQ_LENGTH
    max_seq = min(max_seq, spec.context_window)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return LoadedEncoder(spec, TextEncoder(encoder, tokenizer, max_seq))


def _check_pooling(spec: ModelSpec, folder: Path, config: BertConfig) -> None:
    # The encoder only implements mean pooling; a CLS- or max-pooled model would load fine
    # and return plausible but wrong vectors, so refuse it here.
    pooling_file = folder / "1_Pooling" / "config.json"
    modes = json.loads(pooling_file.read_text()) if pooling_file.is_file() else {}
    folder_mean = modes.get("pooling_mode_mean_tokens", True) and not any(
        value for key, value in modes.items()
        if key.startswith("pooling_mode_") and key != "pooling_mode_mean_tokens")
    if spec.extra.get("pooling", "mean") != "mean" or not folder_mean:
        raise ValueError(f"{spec.id}: only mean pooling is supported")
    dimensions = spec.extra.get("dimensions", config.hidden_size)
    if dimensions != config.hidden_size:
        raise ValueError(f"{spec.id}: catalog says {dimensions} dimensions, the model has "
                         f"{config.hidden_size}")


@hookimpl
def edgefire_register_models(register):
    register("bert", load_bert)
