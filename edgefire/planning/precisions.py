"""What one weight (or one KV element) costs in each storage format, and what a weight codec
changes. The catalog names a model's formats (`config.weight_dtype`,
`config.routed_expert_dtype`) and its codec (`codec:`); the byte rules live here, next to the
formulas that use them, each checked against a loaded model in tests/test_planning_node.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from edgefire.contract.errors import PlanningError


@dataclass(slots=True, frozen=True)
class Precision:
    name: str
    bits: float  # per weight
    group: int = 0  # weights per quantization group (0: none)
    group_bits: int = 0  # per group: scales and zero points
    row_bits: int = 0  # per output row: per-channel scales

    def nbytes(self, params: int, rows: int = 0) -> float:
        bits = params * self.bits + rows * self.row_bits
        if self.group:
            bits += -(-params // self.group) * self.group_bits
        return bits / 8

    def effective_bits(self, row_length: int = 4096) -> float:
        """Bits per weight with overheads, for a matrix with rows of row_length weights."""
        return self.nbytes(row_length * 1024, 1024) * 8 / (row_length * 1024)


PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision("fp32", 32),
    Precision("bf16", 16),
    Precision("fp16", 16),
    # FP8 E4M3 with one fp32 scale per 128×128 block, as DeepSeek-V3 ships its weights.
    Precision("fp8", 8, group=128 * 128, group_bits=32),
    # plugins/int8: weight-only, one bfloat16 scale per output channel.
    Precision("int8", 8, row_bits=16),
    # plugins/int4 (weight_precision "int4-g32"): groups of 32 with a bfloat16 scale and
    # minimum each, 5 bits per weight.
    Precision("int4-g32", 4, group=32, group_bits=32),
    # Kimi K2's published routed experts: symmetric INT4 (compressed-tensors pack-quantized),
    # groups of 32 with one bfloat16 scale, 4.5 bits per weight.
    Precision("int4-g32-sym", 4, group=32, group_bits=16),
    # Unweight's palette form (plugins/unweight): a 4-bit exponent index and the 8-bit sign
    # and mantissa; rows with a rare exponent are kept verbatim (data-dependent, ~1% here).
    Precision("unweight", 12),
)}

KV_DTYPES = ("bf16", "fp16", "fp32", "fp8")


def precision(name: str, field: str = "weight_dtype") -> Precision:
    found = PRECISIONS.get(name)
    if found is None:
        raise PlanningError(f"unknown precision {name!r} (known: {', '.join(PRECISIONS)})",
                            field=field)
    return found


def kv_element_bytes(kv_dtype: str) -> float:
    if kv_dtype not in KV_DTYPES:
        raise PlanningError(f"unknown KV dtype {kv_dtype!r} (known: {', '.join(KV_DTYPES)})",
                            field="kv_dtype")
    return PRECISIONS[kv_dtype].bits / 8


@dataclass(slots=True, frozen=True)
class Codec:
    """A weight codec plugin as the planner sees it: the format it stores each kind of weight
    group in ("projections", "embeddings"; a kind it does not name stays as it is), and (for a
    lossless one) the only format it can take in."""

    name: str
    stores: Mapping[str, str] = field(default_factory=dict)  # kind -> a PRECISIONS name
    takes: str | None = None  # lossless codecs re-encode one format (Unweight: bf16)

    def apply(self, kind: str, current: Precision) -> Precision:
        """The format a weight group of `kind` ends up in. A codec never makes a weight
        larger: Kimi's INT4 experts stay INT4 under `int8`."""
        stored = self.stores.get(kind)
        if stored is None or (self.takes is not None and current.name != self.takes):
            return current
        target = PRECISIONS[stored]
        return target if target.bits < current.bits else current


CODECS: dict[str, Codec] = {c.name: c for c in (
    Codec("identity"),
    # plugins/quant: the projections in the codec's bits, the embedding table (and a tied
    # lm_head) in INT8 rows under both.
    Codec("int8", {"projections": "int8", "embeddings": "int8"}),
    Codec("int4", {"projections": "int4-g32", "embeddings": "int8"}),
    # plugins/unweight holds the embedding table (and a tied lm_head) compressed too.
    Codec("unweight", {"projections": "unweight", "embeddings": "unweight"}, takes="bf16"),
)}


def codec(name: str) -> Codec:
    found = CODECS.get(name)
    if found is None:
        raise PlanningError(f"unknown codec {name!r} (known: {', '.join(CODECS)})",
                            field="codec")
    return found
