"""The native Unweight decoder (built on first use)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from models.native import load_native

_SOURCE = Path(__file__).with_name("unweight_decode.cpp")


def decoder() -> ModuleType | None:
    """The compiled decoder, or None: decoding then uses the numpy lockstep decoder."""
    return load_native("edgefire_unweight_decode", _SOURCE)
