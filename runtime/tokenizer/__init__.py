"""Tokenization: GGUF vocabularies, chat templates and streaming detokenization."""

from __future__ import annotations

from runtime.tokenizer.chat_template import ChatTemplate
from runtime.tokenizer.detokenizer import IncrementalDetokenizer
from runtime.tokenizer.gguf_tokenizer import Tokenizer, load_gguf_tokenizer

__all__ = ["ChatTemplate", "IncrementalDetokenizer", "Tokenizer", "load_gguf_tokenizer"]
