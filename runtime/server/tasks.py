"""The tasks the catalog's models perform, as `/ai/models/*` shows them, with their JSON Schemas.

The schemas describe what this server accepts (runtime.server.prompts, inputs and
SamplingParams.validate), which is Workers AI's schema with this engine's ranges.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from runtime.engine.sampling_params import MAX_STOP_CHARS, MAX_STOP_STRINGS
from runtime.node.served import TEXT_EMBEDDINGS, TEXT_GENERATION


@dataclass(slots=True, frozen=True)
class Task:
    id: str  # Cloudflare's task UUID
    name: str
    description: str
    input_schema: dict | None = None  # None: no schema for this task here
    output_schema: dict | None = None


def _number(low: float, high: float, default: float | None = None, *,
            exclusive_low: bool = False) -> dict:
    schema = {"type": "number", "maximum": high,
              "exclusiveMinimum" if exclusive_low else "minimum": low}
    return schema if default is None else schema | {"default": default}


_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}

_MESSAGE = {
    "type": "object", "required": ["role", "content"],
    "properties": {
        "role": {"type": "string", "description": "system, user, assistant or tool"},
        "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]},
    },
}

_STOP = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS}

_GENERATION_OPTIONS = {
    "raw": {"type": "boolean", "default": False, "description": "skip the chat template"},
    "stream": {"type": "boolean", "default": False,
               "description": "server-sent events: {response} per increment, then usage"},
    "max_tokens": {"type": "integer", "minimum": 1, "default": 256},
    "temperature": _number(0, 5, 0.6),
    "top_p": _number(0, 1, exclusive_low=True),
    "top_k": {"type": "integer", "minimum": 0, "description": "0 disables top-k"},
    "seed": {"type": "integer", "minimum": 0},
    "repetition_penalty": _number(0, 2, exclusive_low=True),
    "frequency_penalty": _number(-2, 2),
    "presence_penalty": _number(-2, 2),
    "stop": {"oneOf": [_STOP, {"type": "array", "items": _STOP, "maxItems": MAX_STOP_STRINGS}]},
}


def _variant(title: str, key: str, schema: dict) -> dict:
    return {"title": title, "type": "object", "required": [key],
            "properties": {key: schema, **_GENERATION_OPTIONS}}


_TEXT_GENERATION_INPUT = {"type": "object", "oneOf": [
    _variant("Prompt", "prompt", {"type": "string", "minLength": 1}),
    _variant("Messages", "messages", {"type": "array", "minItems": 1, "items": _MESSAGE}),
]}

_TEXT_GENERATION_OUTPUT = {
    "oneOf": [
        {"type": "object", "contentType": "application/json", "properties": {
            "response": {"type": "string"},
            "usage": {"type": "object", "properties": {
                "prompt_tokens": {"type": "integer"},
                "completion_tokens": {"type": "integer"},
                "total_tokens": {"type": "integer"},
                "prompt_tokens_details": {"type": "object", "properties": {
                    "cached_tokens": {"type": "integer"}}},
            }},
        }},
        {"type": "string", "contentType": "text/event-stream", "format": "binary"},
    ],
}

_TEXT = {"type": "string", "minLength": 1}

_TEXT_EMBEDDINGS_INPUT = {
    "type": "object", "required": ["text"],
    "properties": {
        "text": {"oneOf": [_TEXT, {"type": "array", "items": _TEXT, "minItems": 1,
                                   "maxItems": 100}]},
        "pooling": {"type": "string", "enum": ["mean"], "default": "mean"},
    },
}

_TEXT_EMBEDDINGS_OUTPUT = {
    "type": "object", "contentType": "application/json",
    "properties": {
        "shape": {"type": "array", "items": {"type": "integer"}},
        "data": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
        "pooling": {"type": "string", "enum": ["mean"]},
    },
}

TASKS = {
    TEXT_GENERATION: Task(
        "c329a1f9-323d-4e91-b2aa-582dd4188d34", "Text Generation",
        "Family of generative text models, such as large language models (LLM), that can be "
        "adapted for a variety of natural language tasks.",
        _TEXT_GENERATION_INPUT, _TEXT_GENERATION_OUTPUT),
    TEXT_EMBEDDINGS: Task(
        "0137cdcf-162a-4108-94f2-1ca59e8c65ee", "Text Embeddings",
        "Feature extraction models transform raw data into numerical features that can be "
        "processed while preserving the information in the original dataset.",
        _TEXT_EMBEDDINGS_INPUT, _TEXT_EMBEDDINGS_OUTPUT),
}


def task_of(task_id: str) -> Task:
    """The task for a catalog task id; one this table lacks gets a stable id and no schema."""
    known = TASKS.get(task_id)
    if known is not None:
        return known
    name = task_id.replace("-", " ").title()
    return Task(str(uuid.uuid5(uuid.NAMESPACE_URL, f"edgefire:task:{task_id}")), name, "")
