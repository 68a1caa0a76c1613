"""Streaming detokenization that never emits half of a UTF-8 character."""

from __future__ import annotations

from typing import Protocol

_REPLACEMENT = "\ufffd"
# Prompt tokens kept as decoding context: decoders such as SentencePiece's drop the leading
# space of the first token in a sequence, so the first generated token must not decode alone.
_PROMPT_CONTEXT = 5
# An incomplete UTF-8 tail spans at most 3 tokens, so holding back longer than this means the
# bytes are genuinely invalid (or a literal U+FFFD); emit them rather than re-decode forever.
_MAX_HELD = 8
# Drop consumed ids once this many pile up, keeping memory flat on long generations.
_COMPACT_AT = 256


class _Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str: ...


class IncrementalDetokenizer:
    """Turn generated token ids into text deltas one token at a time.

    Follows vLLM's scheme: keep a window starting at the previous emission point, decode it,
    and emit what lies beyond the already-emitted prefix once it no longer ends in U+FFFD (an
    incomplete multi-byte character). Each push decodes only the window, so the cost per token
    does not grow with the sequence length.
    """

    __slots__ = ("_tok", "_skip", "_ids", "_prefix", "_read", "_prefix_len")

    def __init__(
        self,
        tokenizer: _Decoder,
        prompt_ids: list[int] | None = None,
        skip_special_tokens: bool = True,
    ) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = list(prompt_ids[-_PROMPT_CONTEXT:]) if prompt_ids else []
        # _ids[_prefix:_read] was already emitted and is the context of the next decode;
        # _ids[_read:] is held back; _prefix_len is the length of the context's text.
        self._prefix = 0
        self._read = len(self._ids)
        self._prefix_len = len(self._decode(0, self._read))

    def _decode(self, start: int, end: int) -> str:
        if start >= end:
            return ""
        return self._tok.decode(self._ids[start:end], skip_special_tokens=self._skip)

    def _emit(self, text: str) -> str:
        delta = text[self._prefix_len :]
        self._prefix, self._read = self._read, len(self._ids)
        self._prefix_len = len(self._decode(self._prefix, self._read))
        if self._prefix >= _COMPACT_AT:
            del self._ids[: self._prefix]
            self._read -= self._prefix
            self._prefix = 0
        return delta

    def push(self, token_id: int) -> str:
        """Add one generated token; return the text that became stable (possibly "")."""
        self._ids.append(token_id)
        text = self._decode(self._prefix, len(self._ids))
        complete = len(text) > self._prefix_len and not text.endswith(_REPLACEMENT)
        if complete or len(self._ids) - self._read >= _MAX_HELD:
            return self._emit(text)
        return ""

    def flush(self) -> str:
        """Return whatever is still held back; call once generation has ended."""
        if len(self._ids) == self._read:
            return ""
        return self._emit(self._decode(self._prefix, len(self._ids)))
