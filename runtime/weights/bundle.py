"""Compressed model bundles: one safetensors file that runs a model without its source file.

`edgefire compress` writes one from a model's runtime-layout weights (what the loader builds,
in BF16); a loader whose catalog entry points at one decodes it instead of converting the
source. A tensor the codec compresses is stored as a uint8 tensor of the codec's bytes, any
other as it is. The header's string metadata carries the rest: format version, codec,
architecture, model config and tokenizer (serialised as the warm cache does), every tensor's
dtype, shape and CRC-32, and the source file's name, size and SHA-256.

The CRC-32s (~3 GB/s, a small part of decoding) turn a damaged file into an error instead of
silently wrong weights, and keep damaged bytes away from the native decoder, which trusts them.
A bundle load skips the warm cache: storing decoded weights would undo the compression on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from edgefire.contract.errors import CorruptWeightsError
from edgefire.runtime.plugins import load_plugins
from edgefire.runtime.tokenizer import Tokenizer
from edgefire.runtime.weights.aligned import aligned, save_aligned
from edgefire.runtime.weights.codec import WeightCodec
from edgefire.runtime.weights.warm_cache import ENV_VAR, WarmEntry, dtype_name, fsync

FORMAT = "edgefire-bundle"
# Bump when the stored layout changes; a codec versions its own bytes.
FORMAT_VERSION = 1
SUFFIX = ".safetensors"
DEFAULT_CODEC = "unweight"


class BundleCodec(WeightCodec, Protocol):
    def to_bytes(self, encoded: Any) -> bytes | None:
        """`encoded` as bytes that `decode` accepts; None when the codec keeps it as it is."""
        ...


@dataclass(slots=True, frozen=True)
class BundleStats:
    tensors: int
    raw_bytes: int  # the weights as given to the codec
    bundle_bytes: int  # the whole file

    @property
    def reduction(self) -> float:
        return 1 - self.bundle_bytes / self.raw_bytes


def default_path(model_id: str, codec: str) -> Path:
    root = Path(os.environ.get(ENV_VAR) or "~/.cache/edgefire").expanduser() / "bundles"
    return root / f"{model_id.removeprefix('@cf/').replace('/', '--')}.{codec}{SUFFIX}"


def is_bundle(path: Path) -> bool:
    """Whether a loader should read path as a bundle (read_bundle checks that it is one)."""
    return path.is_file() and path.suffix == SUFFIX


def write_bundle(path: Path, entry: WarmEntry, codec: BundleCodec, *, architecture: str,
                 source: Path, progress: bool = False) -> BundleStats:
    """Encode entry's weights (held in one dtype) and write the bundle atomically."""
    (weights,) = entry.weights.values()
    raw_bytes = sum(t.nbytes for t in weights.values())
    stored: dict[str, torch.Tensor] = {}
    index: dict[str, dict[str, Any]] = {}
    with tqdm(total=raw_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc="compress",
              disable=not progress) as bar:
        for name, tensor in weights.items():
            blob = codec.to_bytes(codec.encode(tensor))
            data = (tensor.contiguous() if blob is None
                    else torch.frombuffer(bytearray(blob), dtype=torch.uint8))
            stored[name] = data
            index[name] = {"dtype": dtype_name(tensor.dtype), "shape": list(tensor.shape),
                           "encoded": blob is not None, "crc32": _crc32(data)}
            bar.update(tensor.nbytes)
    metadata = {
        "format": FORMAT, "format_version": str(FORMAT_VERSION), "codec": codec.name,
        "architecture": architecture, "model": json.dumps(entry.model_meta),
        "tokenizer": entry.tokenizer.to_json(), "tensors": json.dumps(index),
        "source": json.dumps(_describe(source)),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_aligned(stored, tmp, metadata)
        fsync(tmp)  # the data must be on disk before the rename publishes it
        os.replace(tmp, path)
        fsync(path.parent)
    finally:
        tmp.unlink(missing_ok=True)
    return BundleStats(len(stored), raw_bytes, path.stat().st_size)


def read_bundle(path: Path, architecture: str, dtypes: Sequence[torch.dtype]) -> WarmEntry:
    """The decoded weights cast to each of dtypes, with the tokenizer and model config.

    CorruptWeightsError, naming path, when the file is damaged or is not a bundle of a model
    of `architecture`.
    """
    try:
        weights, tokenizer, model_meta = _read(path, architecture)
    except (SafetensorError, OSError, ValueError, KeyError, TypeError) as exc:
        raise CorruptWeightsError(f"cannot read bundle {path}: {exc}") from exc
    per_dtype = {dtype: {name: w.to(dtype) for name, w in weights.items()} for dtype in dtypes}
    return WarmEntry(per_dtype, tokenizer, model_meta)


def _read(path: Path,
          architecture: str) -> tuple[dict[str, torch.Tensor], Tokenizer, dict[str, Any]]:
    with safe_open(path, "pt") as file:  # tensors are memory-mapped, not read
        meta = file.metadata() or {}
        if meta.get("format") != FORMAT:
            raise ValueError(f"not an edgefire bundle (no {FORMAT!r} format marker)")
        if meta["format_version"] != str(FORMAT_VERSION):
            raise ValueError(f"format version {meta['format_version']}, this runtime reads "
                             f"{FORMAT_VERSION}")
        if meta["architecture"] != architecture:
            raise ValueError(f"it holds a {meta['architecture']!r} model, not {architecture!r}")
        index = json.loads(meta["tensors"])
        if set(index) != set(file.keys()):
            raise ValueError("it holds other tensors than its header lists")
        codec: WeightCodec = load_plugins().codecs.get(meta["codec"])()
        weights = {name: _restore(name, file.get_tensor(name), info, codec)
                   for name, info in index.items()}
    return weights, Tokenizer.from_json(meta["tokenizer"]), json.loads(meta["model"])


def _restore(name: str, stored: torch.Tensor, info: dict[str, Any],
             codec: WeightCodec) -> torch.Tensor:
    if _crc32(stored) != info["crc32"]:
        raise ValueError(f"tensor {name!r} fails its CRC-32 check")
    tensor = codec.decode(memoryview(stored.numpy())) if info["encoded"] else stored
    if dtype_name(tensor.dtype) != info["dtype"] or list(tensor.shape) != info["shape"]:
        raise ValueError(f"tensor {name!r} decodes to {dtype_name(tensor.dtype)} "
                         f"{list(tensor.shape)}, not {info['dtype']} {info['shape']}")
    return aligned(tensor)


def _crc32(tensor: torch.Tensor) -> int:
    return zlib.crc32(tensor.contiguous().reshape(-1).view(torch.uint8).numpy())


def _describe(source: Path) -> dict[str, Any]:
    with open(source, "rb") as f:
        sha256 = hashlib.file_digest(f, "sha256").hexdigest()
    return {"name": source.name, "size": source.stat().st_size, "sha256": sha256}
