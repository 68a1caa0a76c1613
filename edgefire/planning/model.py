"""A catalog model as the planner reads it: architecture, real config, codec, context window;
the bytes of each weight group in the formats they are stored in; KV bytes per token."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from edgefire.contract.errors import PlanningError
from edgefire.planning.precisions import codec as codec_named
from edgefire.planning.precisions import kv_element_bytes, precision
from edgefire.planning.shapes import Layer, ModelShape, Weights, shape

# Keys of a `miniature:` block that describe how it is made, not its shape.
_MAKING = {"seed", "derive", "synthetic", "description"}
# The real model's own: its publisher's figures (a miniature's size comes from its shape) and
# storage formats (a node here holds every weight in its compute dtype).
_REAL_ONLY = {"params_b", "active_params_b", "weight_dtype", "routed_expert_dtype"}


class CatalogEntry(Protocol):
    """What edgefire.contract.catalog.ModelSpec offers (structural, so that the contract may
    import the planner without the planner importing the contract's catalog)."""

    id: str
    task: str
    architecture: str
    context_window: int
    codec: str
    extra: dict


@dataclass(slots=True, frozen=True)
class PlannedModel:
    id: str
    architecture: str
    config: Mapping[str, Any]
    codec: str = "identity"
    context_window: int = 8192
    shape: ModelShape = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.config, Mapping):
            raise PlanningError(f"{self.id} has no config to plan from", field="config")
        object.__setattr__(self, "shape", shape(self.architecture, self.config))
        # Unknown formats and codecs are refused here, not mid-plan.
        codec_named(self.codec)
        for key in ("weight_dtype", "routed_expert_dtype"):
            if key in self.config:
                precision(self.config[key], field=key)

    @classmethod
    def real(cls, spec: CatalogEntry, codec: str | None = None) -> PlannedModel:
        """The published model (catalog `config:`), as the fleet's GPUs would hold it."""
        return cls(spec.id, spec.architecture, spec.extra.get("config"), codec or spec.codec,
                   spec.context_window)

    @classmethod
    def on_this_machine(cls, spec: CatalogEntry) -> PlannedModel | None:
        """What a node here loads: the miniature (its `miniature:` keys over the real config)
        when there is one, else the real config; None when the entry has neither."""
        real = spec.extra.get("config")
        mini = spec.extra.get("miniature")
        if isinstance(mini, Mapping) and isinstance(real, Mapping):
            small = {k: v for k, v in real.items() if k not in _REAL_ONLY}
            small |= {k: v for k, v in mini.items() if k not in _MAKING}
            return cls(spec.id, spec.architecture, small, spec.codec, spec.context_window)
        if not isinstance(real, Mapping):
            return None
        return cls.real(spec)

    @property
    def encoder(self) -> bool:
        return self.shape.encoder


def group_bytes(model: PlannedModel, weights: Weights, dense: str | None = None) -> float:
    """Bytes of one weight group: its fixed format, else the format its config key names (or
    `dense`, the node's compute dtype, which replaces every stored format on this machine),
    then the codec."""
    if weights.fixed is not None:
        name = weights.fixed
    elif dense is not None:
        name = dense
    else:
        name = model.config.get(weights.dtype_key) or model.config.get("weight_dtype", "bf16")
    stored = codec_named(model.codec).apply(weights.kind, precision(name))
    return stored.nbytes(weights.params, weights.rows)


def layer_bytes(model: PlannedModel, layer: Layer, dense: str | None = None) -> float:
    return sum(group_bytes(model, w, dense) for w in layer.weights)


def weight_bytes(model: PlannedModel, dense: str | None = None) -> int:
    s = model.shape
    ends = sum(group_bytes(model, w, dense) for w in (*s.head, *s.tail))
    return round(ends + sum(layer_bytes(model, layer, dense) for layer in s.layers))


def dense_copy_bytes(model: PlannedModel, dense: str) -> int:
    """Bytes of one more copy of the weights in the `dense` format: the groups the codec keeps
    dense (a resident quantized or packed group is one object shared by every compute dtype)."""
    s = model.shape
    groups = (*s.head, *s.tail, *(w for layer in s.layers for w in layer.weights))
    codec, plain = codec_named(model.codec), precision(dense)
    # A lossless codec's kinds stay in its form for every compute dtype (Unweight's packed
    # rows serve float32 steps too: no float32 copy), though it re-encodes only its input one.
    kept = [w for w in groups if w.fixed is not None
            or (codec.apply(w.kind, plain).nbytes(w.params, w.rows)
                == plain.nbytes(w.params, w.rows)
                and not (codec.takes is not None and w.kind in codec.stores))]
    return round(sum(group_bytes(model, w, dense) for w in kept))


def kv_bytes_per_token(model: PlannedModel, kv_dtype: str = "bf16", *,
                       all_layers: bool = False) -> int:
    """KV bytes one token of a long sequence costs: layers that keep full-length KV only
    (a chunked-local layer's cost is bounded per sequence: local_kv_bytes_per_sequence), or
    with `all_layers` every layer, as a paged pool with one block table per sequence stores
    it (the node's engine)."""
    per = kv_element_bytes(kv_dtype)
    return round(sum(layer.kv.elements * per for layer in model.shape.layers
                     if layer.kv and (all_layers or layer.kv.window is None)))


def local_kv_bytes_per_sequence(model: PlannedModel, kv_dtype: str = "bf16") -> int:
    """The most KV a sequence keeps in the chunked-local layers: a full chunk in each."""
    per = kv_element_bytes(kv_dtype)
    return round(sum(layer.kv.elements * per * layer.kv.window for layer in model.shape.layers
                     if layer.kv and layer.kv.window is not None))
