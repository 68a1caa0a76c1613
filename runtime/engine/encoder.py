"""Sentence embeddings: tokenize, batch by length, encode, pool; and an asyncio front end.

The embedding side's counterpart of the text engine: an `Encoder` (the architecture, as a
CausalLM is for text), a `TextEncoder` (it and its tokenizer: texts in, unit vectors out;
synchronous and not thread-safe) and an `AsyncEncoder`, which runs a TextEncoder on one worker
thread and merges requests that arrive while a forward is running into the next forward.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import torch
from tokenizers import Tokenizer

from edgefire.contract.errors import InvalidInputError

# Text beyond max_seq_length tokens is truncated anyway; the cap only bounds tokenizer work.
MAX_TEXT_CHARS = 100_000


class Encoder(Protocol):
    """What an embedding architecture provides (models/bert.py's BertEncoder)."""

    @property
    def dim(self) -> int: ...

    @property
    def max_positions(self) -> int: ...

    @property
    def weight_bytes(self) -> int: ...

    weight_precision: str  # as edgefire.runtime.weight_precision names it

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor: ...


def validate_texts(texts: object) -> list[str]:
    """The texts as a list, or InvalidInputError naming field "text"."""
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise InvalidInputError("text must be a list of strings", field="text")
    if not texts:
        raise InvalidInputError("text must not be empty", field="text")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidInputError(f"text[{i}] must be a string, not {type(text).__name__}",
                                    field="text")
        if len(text) > MAX_TEXT_CHARS:
            raise InvalidInputError(
                f"text[{i}] has {len(text)} characters; the limit is {MAX_TEXT_CHARS}",
                field="text")
    return list(texts)


class TextEncoder:
    """An encoder and its tokenizer; `embed` returns unit vectors and the tokens it used."""

    def __init__(self, encoder: Encoder, tokenizer: Tokenizer, max_seq_length: int,
                 batch_size: int = 32) -> None:
        self.encoder = encoder
        self.max_seq_length = min(max_seq_length, encoder.max_positions)
        self.batch_size = batch_size
        # A private copy: tokenizer.json ships fixed padding to 128 and truncation at 128;
        # we truncate at max_seq_length (special tokens included) and pad per batch ourselves.
        self.tokenizer = Tokenizer.from_str(tokenizer.to_str())
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_seq_length)
        self._pad_id = self.tokenizer.token_to_id("[PAD]") or 0

    @property
    def dim(self) -> int:
        return self.encoder.dim

    @property
    def memory_bytes(self) -> int:
        return self.encoder.weight_bytes

    @property
    def weight_precision(self) -> str:
        return self.encoder.weight_precision

    def embed(self, texts: list[str]) -> tuple[torch.Tensor, int]:
        """Vectors [len(texts), dim] float32 (unit norm) and the total token count."""
        vectors, counts = self.embed_with_counts(texts)
        return vectors, sum(counts)

    def embed_with_counts(self, texts: list[str]) -> tuple[torch.Tensor, list[int]]:
        """As `embed`, with each text's token count (special tokens included)."""
        texts = validate_texts(texts)
        ids = [enc.ids for enc in self.tokenizer.encode_batch(texts, add_special_tokens=True)]
        counts = [len(row) for row in ids]
        # Longest first, so each chunk pads to near its own length and the first chunk shows
        # the peak memory at once.
        order = sorted(range(len(ids)), key=lambda i: -counts[i])
        out = torch.empty(len(ids), self.dim, dtype=torch.float32)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            input_ids, mask = self._pad([ids[i] for i in chunk])
            out[torch.tensor(chunk)] = self.encoder.embed(input_ids, mask).float()
        return out, counts

    def _pad(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(row) for row in rows)
        input_ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            input_ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, :len(row)] = 1
        return input_ids, mask


@dataclass(slots=True)
class _Request:
    texts: list[str]
    future: asyncio.Future[tuple[torch.Tensor, int]]


class AsyncEncoder:
    """Serves concurrent `embed` calls from one event loop with one forward at a time.

    Requests that arrive while a forward runs wait and then go together in the next one, up to
    `max_batch_texts` texts (a single larger request still runs, alone).
    """

    def __init__(self, encoder: TextEncoder, max_batch_texts: int = 256,
                 executor: Executor | None = None) -> None:
        self.encoder = encoder
        self.max_batch_texts = max_batch_texts
        self.num_batches = 0  # forwards run, for metrics and tests
        # A node passes its compute thread; alone, the encoder runs forwards on its own thread.
        self._owns_executor = executor is None
        self._executor = executor or ThreadPoolExecutor(max_workers=1,
                                                        thread_name_prefix="encoder")
        self._pending: list[_Request] = []
        self._drainer: asyncio.Task | None = None
        self._closed = False
        self._lock = threading.Lock()  # close() may come from another thread than the loop

    async def embed(self, texts: list[str]) -> tuple[torch.Tensor, int]:
        """Vectors [len(texts), dim] and the token count, as TextEncoder.embed."""
        # Validated here so that a bad request fails alone instead of failing its batch.
        texts = validate_texts(texts)
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._closed:
                raise RuntimeError("AsyncEncoder is closed")
            request = _Request(texts, loop.create_future())
            self._pending.append(request)
            if self._drainer is None or self._drainer.done():
                self._drainer = loop.create_task(self._drain())
        return await request.future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                batch = self._take_batch()
            if not batch:
                return
            texts = [text for request in batch for text in request.texts]
            try:
                vectors, counts = await loop.run_in_executor(
                    self._executor, self.encoder.embed_with_counts, texts)
            except Exception as exc:  # handed to every caller in the batch
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(exc)
                continue
            self.num_batches += 1
            start = 0
            for request in batch:
                end = start + len(request.texts)
                if not request.future.done():  # the caller may have been cancelled
                    request.future.set_result((vectors[start:end], sum(counts[start:end])))
                start = end

    def _take_batch(self) -> list[_Request]:
        batch: list[_Request] = []
        total = 0
        while self._pending:
            size = len(self._pending[0].texts)
            if batch and total + size > self.max_batch_texts:
                break
            batch.append(self._pending.pop(0))
            total += size
        return batch

    def close(self) -> None:
        """Fail waiting requests and stop the worker (a running forward is not interrupted)."""
        with self._lock:
            self._closed = True
            pending, self._pending = self._pending, []
        for request in pending:
            future = request.future
            if not future.done():
                future.get_loop().call_soon_threadsafe(
                    _fail, future, RuntimeError("AsyncEncoder was closed"))
        if self._owns_executor:
            self._executor.shutdown(wait=False)


def _fail(future: asyncio.Future, exc: Exception) -> None:
    if not future.done():
        future.set_exception(exc)
