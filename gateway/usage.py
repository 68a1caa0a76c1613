"""Token counts read back from an upstream answer (JSON body or the tail of an SSE stream), and
for a stream that ends before its usage event, counted from what was relayed."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass


@dataclass(slots=True)
class Tokens:
    tokens_in: int = 0
    tokens_out: int = 0
    cached_in: int = 0


def tokens_from_json(body: bytes) -> Tokens:
    """Usage of a Workers AI envelope (`result.usage`) or an OpenAI body (`usage`)."""
    # Every answer is counted (the gateway's metrics), not only logged ones: a body without a
    # usage key (an embedding's vectors) is not parsed for nothing.
    if b'"usage"' not in body:
        return Tokens()
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


# An event that carries text: a native `{"response": "…"}` or an OpenAI `"content": "…"` delta.
_TEXT_EVENT = re.compile(rb'^data: \{.*"(?:response|content)": ?"(?:[^"\\]|\\.)', re.M)


class StreamMeter:
    """Counts a relayed stream's text events. The node sends one per token that makes text,
    so a stream cut short (the client left) is charged at least what it was sent."""

    def __init__(self, prompt_tokens: str | None) -> None:
        self.prompt_tokens = int(prompt_tokens) if (prompt_tokens or "").isdigit() else 0
        self.text_events = 0
        self._partial = b""  # a line split between chunks

    def feed(self, chunk: bytes) -> None:
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        self.text_events += len(_TEXT_EVENT.findall(b"\n".join(lines)))

    def tokens(self, tail: bytes) -> Tokens:
        """The stream's usage event if it reached one, else the relayed count."""
        reported = tokens_from_sse(tail)
        if reported.tokens_in or reported.tokens_out:
            return reported
        return Tokens(self.prompt_tokens, self.text_events)


def _tokens(usage: object) -> Tokens:
    if not isinstance(usage, dict):
        return Tokens()
    details = usage.get("prompt_tokens_details") or {}
    return Tokens(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                  int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0)
