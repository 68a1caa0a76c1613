"""Text embeddings for the HTTP routes: the texts as a list, hold the model, embed in time."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgefire.contract.catalog import ModelSpec
from edgefire.contract.http_errors import time_limit
from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.server.metrics import ServerMetrics


@dataclass(slots=True)
class Embeddings:
    vectors: torch.Tensor  # [len(texts), dim], float32
    num_tokens: int
    weight_precision: str


class Embedder:
    def __init__(self, node: EdgeNode, metrics: ServerMetrics) -> None:
        self.node = node
        self.metrics = metrics

    async def embed(self, spec: ModelSpec, texts: list[str]) -> Embeddings:
        timer = self.metrics.timer(spec.id)
        async with time_limit(self.node.settings.request_timeout_s):
            try:
                async with self.node.registry.use(spec.id) as served:
                    vectors, num_tokens = await served.encoder.embed(texts)
                    precision = served.weight_precision
            except BaseException as exc:  # cancelled: the client is gone or time ran out
                timer.end("error" if isinstance(exc, Exception) else "aborted")
                raise
        timer.prompt_processed(num_tokens)
        timer.end("success")
        return Embeddings(vectors, num_tokens, precision)
