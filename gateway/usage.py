"""Token counts read back from an upstream answer (JSON body or the tail of an SSE stream)."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(slots=True)
class Tokens:
    tokens_in: int = 0
    tokens_out: int = 0
    cached_in: int = 0


def tokens_from_json(body: bytes) -> Tokens:
    """Usage of a Workers AI envelope (`result.usage`) or an OpenAI body (`usage`)."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return Tokens()
    if not isinstance(data, dict):
        return Tokens()
    usage = data.get("usage")
    if usage is None and isinstance(data.get("result"), dict):
        usage = data["result"].get("usage")
    return _tokens(usage)


def tokens_from_sse(tail: bytes) -> Tokens:
    """Usage of the last event that carries one (both APIs send it near the end)."""
    for line in reversed(tail.decode("utf-8", "replace").splitlines()):
        if line.startswith("data: {") and '"usage"' in line:
            try:
                return _tokens(json.loads(line[6:]).get("usage"))
            except ValueError:
                continue
    return Tokens()


def _tokens(usage: object) -> Tokens:
    if not isinstance(usage, dict):
        return Tokens()
    details = usage.get("prompt_tokens_details") or {}
    return Tokens(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                  int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0)
