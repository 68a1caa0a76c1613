"""Text embeddings for the HTTP routes: check the texts, hold the model, embed in time."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.catalog import ModelSpec
from runtime.errors import InvalidInputError
from runtime.node.node import EdgeNode
from runtime.server.errors import time_limit
from runtime.server.metrics import ServerMetrics

MAX_TEXTS = 100  # Workers AI's maxItems for `text`


@dataclass(slots=True)
class Embeddings:
    vectors: torch.Tensor  # [len(texts), dim], float32
    num_tokens: int
    weight_precision: str


def texts_input(value: object, field: str) -> list[str]:
    """One string or 1..MAX_TEXTS non-empty strings, as a list; else 5006 naming `field`."""
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts:
        raise InvalidInputError(f"{field} must be a string or a non-empty array of strings",
                                field=field)
    if len(texts) > MAX_TEXTS:
        raise InvalidInputError(f"{field} has {len(texts)} items; the limit is {MAX_TEXTS}",
                                field=field)
    for i, text in enumerate(texts):
        if not isinstance(text, str) or not text:
            raise InvalidInputError(f"{field}[{i}] must be a non-empty string", field=field)
    return texts


class Embedder:
    def __init__(self, node: EdgeNode, metrics: ServerMetrics) -> None:
        self.node = node
        self.metrics = metrics

    async def embed(self, spec: ModelSpec, texts: list[str]) -> Embeddings:
        timer = self.metrics.timer(spec.id)
        async with time_limit(self.node.settings.request_timeout_s):
            try:
                async with self.node.registry.use(spec.id) as served:
                    vectors, num_tokens = await served.embedder.embed(texts)
                    precision = served.weight_precision
            except BaseException as exc:  # cancelled: the client is gone or time ran out
                timer.end("error" if isinstance(exc, Exception) else "aborted")
                raise
        timer.prompt_processed(num_tokens)
        timer.end("success")
        return Embeddings(vectors, num_tokens, precision)
