"""A text-embeddings request, parsed once: Workers AI's run inputs or an OpenAI embeddings body."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgefire.contract.bodies import given
from edgefire.contract.catalog import ModelSpec
from edgefire.contract.errors import InvalidInputError
from edgefire.contract.schemas import EMBEDDINGS_REQUEST, TASK_SCHEMAS, TEXT_EMBEDDINGS
from edgefire.contract.validation import Checker

_RUN = Checker(TASK_SCHEMAS[TEXT_EMBEDDINGS][0])
_OPENAI = Checker(EMBEDDINGS_REQUEST)


@dataclass(slots=True, frozen=True)
class EmbeddingRequest:
    texts: list[str]
    pooling: str = "mean"  # Workers AI's: the model's own; another is refused
    encoding_format: str = "float"  # OpenAI's: "float" or "base64"


def parse_run(body: dict[str, Any], spec: ModelSpec) -> EmbeddingRequest:
    """Workers AI's run inputs for the model `spec`; it pools one way (catalog `pooling`)."""
    body = _RUN.check(body)
    pooling = spec.extra.get("pooling", "mean")
    if given(body, "pooling", pooling) != pooling:
        raise InvalidInputError(f"pooling must be {pooling!r} for {spec.id}", field="pooling")
    return EmbeddingRequest(_texts(body["text"]), pooling=pooling)


def parse_openai(body: dict[str, Any]) -> EmbeddingRequest:
    """An OpenAI `POST …/v1/embeddings` body (its `model` is read by the caller)."""
    body = _OPENAI.check(body)
    return EmbeddingRequest(_texts(body["input"]),
                            encoding_format=given(body, "encoding_format", "float"))


def _texts(value: str | list[str]) -> list[str]:
    """One string or a list of them, as a list."""
    return [value] if isinstance(value, str) else value
