"""Tokenization: GGUF vocabularies, chat templates and streaming detokenization."""

from __future__ import annotations

from edgefire.runtime.tokenizer.chat_template import ChatTemplate
from edgefire.runtime.tokenizer.detokenizer import IncrementalDetokenizer
from edgefire.runtime.tokenizer.gguf_tokenizer import Tokenizer, load_gguf_tokenizer

__all__ = ["ChatTemplate", "IncrementalDetokenizer", "Tokenizer", "load_gguf_tokenizer"]
