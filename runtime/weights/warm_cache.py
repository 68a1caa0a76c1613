"""Warm-start cache: a model's weights already in runtime layout, plus its tokenizer, on disk.

The first load of a model dequantizes, fuses and casts its weights, then stores them here; later
loads memory-map the stored tensors (safetensors maps the file copy-on-write, so pages come from
the page cache on first touch and are shared by every process serving the model) and skip the
source file entirely: no GGUF parsing, no dequantization, no tokenizer building.

Entries are written to a temporary folder, flushed and renamed into place, so a crash leaves
either a whole entry or none; an entry that does not read back is dropped and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from edgefire.contract.catalog import ModelSpec
from edgefire.runtime.tokenizer import Tokenizer
from edgefire.runtime.weights.aligned import aligned, save_aligned

# Bump when the stored layout or the conversion that produces it changes.
FORMAT_VERSION = 2  # 2: tensors on 64-byte boundaries (aligned.py)
ENV_VAR = "EDGEFIRE_CACHE_DIR"
DEFAULT_ROOT = "~/.cache/edgefire/warm"

WEIGHTS_FILE = "weights.safetensors"
TOKENIZER_FILE = "tokenizer.json"
META_FILE = "meta.json"

log = logging.getLogger(__name__)


@dataclass(slots=True)
class WarmEntry:
    """What a loader needs to build a model without its source file."""

    weights: dict[torch.dtype, dict[str, torch.Tensor]]  # per compute dtype, already cast
    tokenizer: Tokenizer
    model_meta: dict[str, Any]  # architecture-specific (config fields), stored as JSON


def cache_root() -> Path:
    return Path(os.environ.get(ENV_VAR) or DEFAULT_ROOT).expanduser()


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def cache_key(spec: ModelSpec, weights_path: Path, codec: str,
              dtypes: Sequence[torch.dtype]) -> str:
    """Changes whenever what a load would produce may change: source file, codec, dtypes."""
    stat = weights_path.stat()
    identity = {
        "model": spec.id, "path": str(weights_path.resolve()), "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns, "architecture": spec.architecture, "codec": codec,
        "dtypes": [dtype_name(d) for d in dtypes], "format": FORMAT_VERSION,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]


class WarmCache:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or cache_root()

    def load(self, key: str) -> WarmEntry | None:
        """The stored entry, or None on a miss; a damaged entry is removed and counts as one."""
        entry_dir = self.root / key
        if not entry_dir.is_dir():
            return None
        try:
            return _read_entry(entry_dir)
        except Exception as exc:  # whatever is wrong with the entry, a rebuild fixes it
            log.warning("warm cache entry %s is unreadable (%s: %s); rebuilding it",
                        entry_dir, type(exc).__name__, exc)
            shutil.rmtree(entry_dir, ignore_errors=True)
            return None

    def store(self, key: str, entry: WarmEntry) -> None:
        """Write entry atomically; a failure to write only costs the next load its speed."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=self.root))
        except OSError as exc:
            log.warning("cannot create warm cache folder in %s: %s", self.root, exc)
            return
        try:
            _write_entry(tmp, entry)
            os.rename(tmp, self.root / key)
            fsync(self.root)
        except (OSError, SafetensorError) as exc:  # safetensors reports I/O errors its own way
            # Losing a rename race to another process loading the same model is fine.
            if not (self.root / key).is_dir():
                log.warning("cannot write warm cache entry %s: %s", self.root / key, exc)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # nothing left there after the rename


def _write_entry(folder: Path, entry: WarmEntry) -> None:
    flat = {f"{dtype_name(dtype)}/{name}": tensor.contiguous()
            for dtype, tensors in entry.weights.items() for name, tensor in tensors.items()}
    names = sorted({name for tensors in entry.weights.values() for name in tensors})
    meta = {"format_version": FORMAT_VERSION, "dtypes": [dtype_name(d) for d in entry.weights],
            "names": names, "model": entry.model_meta}
    save_aligned(flat, folder / WEIGHTS_FILE)
    (folder / TOKENIZER_FILE).write_text(entry.tokenizer.to_json(), encoding="utf-8")
    (folder / META_FILE).write_text(json.dumps(meta, indent=1), encoding="utf-8")
    # Data must reach the disk before the rename publishes it, or a power cut could leave a
    # complete-looking entry full of zeros.
    for name in (WEIGHTS_FILE, TOKENIZER_FILE, META_FILE):
        fsync(folder / name)


def _read_entry(folder: Path) -> WarmEntry:
    meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
    if meta["format_version"] != FORMAT_VERSION:
        raise ValueError(f"format version {meta['format_version']}, expected {FORMAT_VERSION}")
    flat = load_file(folder / WEIGHTS_FILE)  # memory-mapped, not read
    expected = {f"{d}/{name}" for d in meta["dtypes"] for name in meta["names"]}
    if set(flat) != expected:
        raise ValueError(f"{WEIGHTS_FILE} holds other tensors than {META_FILE} lists")
    weights: dict[torch.dtype, dict[str, torch.Tensor]] = {}
    for d in meta["dtypes"]:
        dtype = getattr(torch, d)
        weights[dtype] = {name: aligned(flat[f"{d}/{name}"]) for name in meta["names"]}
        if any(t.dtype != dtype for t in weights[dtype].values()):
            raise ValueError(f"tensors stored under {d} are not {d}")
    tokenizer = Tokenizer.from_json((folder / TOKENIZER_FILE).read_text(encoding="utf-8"))
    return WarmEntry(weights, tokenizer, meta["model"])


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
