"""A model's weight precision: how its weights are held while it serves, named one way everywhere.

The name is what a loaded model reports as `weight_precision`; the catalog states it before
loading (`stated_precision`), and every inference response carries the loaded model's own in
the `x-edgefire-weight-precision` header (and OpenAI bodies in `system_fingerprint`). Values:

- `int8`, `int4-g32`, `int4-g64`, `int4-g128`: weight-only quantized layer projections;
  embeddings, the LM head and norms stay in the compute dtype. Any codec that keeps a resident
  form of its own (`to_resident`) is named by its `precision` this way.
- `bfloat16`, `float32`, or `float32+bfloat16`: dense weights in the node's compute dtype, both
  when `dtype` is `auto` on a CPU without native bfloat16 (float32 for small steps, bfloat16 for
  batched ones); so codec `identity`, and any codec decoded to dense weights at load.
- embedding models: `float32` whatever the node's dtype (EMBEDDING_DTYPE).
- planning-only models: their published weight dtype (catalog `config.weight_dtype`).
"""

from __future__ import annotations

import torch

from edgefire.contract.catalog import ModelSpec
from edgefire.contract.catalog_api import published_precision
from edgefire.models.precision import dense_precision
from edgefire.runtime.engine.precision import Precision
from edgefire.runtime.plugins import load_plugins

# Embeddings are compared long after they are made, so they are computed in float32 whatever
# the node's dtype (plugins/bert.py has the measurements).
EMBEDDING_DTYPE = torch.float32

def compute_precision(dtype: str) -> str:
    """The precision dense weights take on a node whose `dtype` setting is `dtype`."""
    return dense_precision(Precision.parse(dtype).dtypes)


def stated_precision(spec: ModelSpec, compute: str | None) -> str | None:
    """spec's weight precision as its loaded model will report it; `compute` is the node's
    compute_precision. None where it is unknown: a planning-only model whose catalog entry
    names no weight dtype."""
    if not spec.runnable or not spec.weights:
        return published_precision(spec)
    if spec.task == "text-embeddings":
        return dense_precision([EMBEDDING_DTYPE])
    codec = load_plugins().codecs.get(spec.codec)()
    # As the loader decides: a codec with a resident form keeps it and names its precision.
    if getattr(codec, "to_resident", None) is not None:
        return codec.precision
    return compute
