"""`edgefire compress`: export a model's runtime-layout weights and write them as a bundle."""

from __future__ import annotations

from pathlib import Path

from edgefire.contract.catalog import ModelSpec
from edgefire.contract.errors import InvalidInputError
from edgefire.runtime.plugins import load_plugins
from edgefire.runtime.weights import resolve_source
from edgefire.runtime.weights.bundle import (
    DEFAULT_CODEC,
    BundleStats,
    default_path,
    is_bundle,
    write_bundle,
)


def compress(spec: ModelSpec, out: Path | None = None,
             progress: bool = False) -> tuple[Path, BundleStats]:
    """Write spec's bundle with the default codec to `out` (default: under the cache folder)."""
    source = resolve_source(spec.weights)
    if is_bundle(source):
        raise InvalidInputError(f"{spec.id} is already a bundle ({source})", field="model")
    host = load_plugins()
    export = host.exporters.get(spec.architecture)
    codec = host.codecs.get(DEFAULT_CODEC)()
    out = out or default_path(spec.id, codec.name)
    stats = write_bundle(out, export(spec), codec, architecture=spec.architecture,
                         source=source, progress=progress)
    return out, stats
