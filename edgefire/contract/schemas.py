"""The node's request and response schemas (JSON Schema 2020-12): the one statement of what it
accepts.

Bodies are checked against these (edgefire.contract.validation) before any typed parsing,
and the OpenAPI documents and `/ai/models/schema` show these same dicts, so what is documented
is what is enforced. Rules a schema cannot state stay with the code that knows them: prompt and
messages both given, top_k against the model's vocabulary, a model's pooling, token counts. Null
counts as absent for optional inputs, as clients send it. The heartbeat a node sends the gateway is
here too: both sides read it.

Imports nothing heavy (no torch, no engine): the gateway imports this module.
"""

from __future__ import annotations

MAX_SEED = 2**63 - 1  # a non-negative int64, as SamplingParams.validate checks too
# Stop sequences, as SamplingParams.validate bounds them (OpenAI's count; a length that keeps
# the text a stream holds back, and each token's rescan, small).
MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 256
MAX_TEXTS = 100  # Workers AI's maxItems for embedding texts
MAX_CHOICES = 8  # OpenAI's `n`, bounded so one call cannot take the whole batch
ENCODINGS = ("float", "base64")  # OpenAI embeddings' encoding_format
TEXT_GENERATION = "text-generation"
TEXT_EMBEDDINGS = "text-embeddings"


def nullable(schema: dict) -> dict:
    """schema, or null (an optional input the client sent as null)."""
    if isinstance(schema.get("type"), str):
        return {**schema, "type": [schema["type"], "null"]}
    return {"oneOf": [*schema["oneOf"], {"type": "null"}]} | {
        k: v for k, v in schema.items() if k != "oneOf"}


def _number(low: float, high: float, default: float | None = None, *,
            exclusive_low: bool = False) -> dict:
    schema = {"type": "number", "maximum": high,
              "exclusiveMinimum" if exclusive_low else "minimum": low}
    return nullable(schema if default is None else schema | {"default": default})


def _flag(description: str) -> dict:
    return {"type": ["boolean", "null"], "default": False, "description": description}


_TEXT = {"type": "string", "minLength": 1}
_STOP = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS}
_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}

MESSAGE = {
    "type": "object", "required": ["role"],
    "properties": {
        "role": {"type": "string", "minLength": 1,
                 "description": "system, user, assistant or tool"},
        "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART},
                              {"type": "null"}]},
        "tool_calls": {"type": ["array", "null"], "items": {"type": "object"},
                       "description": "an assistant turn's calls (native or OpenAI form)"},
    },
    # Only an assistant turn may come without text (an OpenAI tool-call turn has none).
    "if": {"properties": {"role": {"const": "assistant"}}},
    "else": {"required": ["content"],
             "properties": {"content": {"type": ["string", "array"]}}},
}
_MESSAGES = {"type": "array", "minItems": 1, "items": MESSAGE}

# Tools: Workers AI's legacy {name, description, parameters} or OpenAI's {type: "function",
# function: {...}}, in both families (edgefire.contract.tools reads them).
_FUNCTION = {"type": "object", "required": ["name"], "properties": {
    "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
    "description": {"type": ["string", "null"]},
    "parameters": {"type": ["object", "null"],
                   "description": "a JSON Schema of the arguments object"}}}
_TOOL = {"oneOf": [
    {"type": "object", "required": ["type", "function"],
     "properties": {"type": {"const": "function"}, "function": _FUNCTION}},
    {**_FUNCTION, "not": {"required": ["function"]}},
]}
_TOOL_CHOICE = {"oneOf": [
    {"enum": ["auto", "none", "required", None]},
    {"type": "object", "required": ["type", "function"], "properties": {
        "type": {"const": "function"},
        "function": {"type": "object", "required": ["name"],
                     "properties": {"name": {"type": "string"}}}}},
]}
MAX_TOOLS = 64

# Workers AI's text-generation inputs besides the prompt; the OpenAI route takes them too.
_GENERATION_OPTIONS = {
    "tools": {"type": ["array", "null"], "items": _TOOL, "maxItems": MAX_TOOLS},
    "tool_choice": _TOOL_CHOICE,
    "parallel_tool_calls": {**_flag("more than one tool call in an answer"), "default": True},
    "raw": _flag("skip the chat template"),
    "stream": _flag("server-sent events: {response} per increment, then usage"),
    "max_tokens": {"type": ["integer", "null"], "minimum": 1, "default": 256},
    "temperature": _number(0, 5, 0.6),
    "top_p": _number(0, 1, exclusive_low=True),
    "top_k": {"type": ["integer", "null"], "minimum": 0,
              "description": "0 disables top-k; at most the model's vocabulary size"},
    "seed": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_SEED},
    "repetition_penalty": _number(0, 2, exclusive_low=True),
    "frequency_penalty": _number(-2, 2),
    "presence_penalty": _number(-2, 2),
    "stop": nullable({"oneOf": [_STOP, {"type": "array", "items": _STOP,
                                        "maxItems": MAX_STOP_STRINGS}]}),
    "options": {"type": ["object", "null"], "properties": {
        "rejectIfBusy": _flag("429 (3040) at once when the model's queue is full")}},
}


# JSON mode. Workers AI's native models take a bare JSON Schema; the OpenAI family wraps it as
# {name, schema, strict}. "text" is the default: free text.
_JSON_SCHEMA = {"type": "object", "description": "a JSON Schema the answer must be valid against"}


def _response_format(json_schema: dict) -> dict:
    return {"type": ["object", "null"], "required": ["type"],
            "properties": {"type": {"enum": ["text", "json_object", "json_schema"]},
                           "json_schema": json_schema},
            "if": {"properties": {"type": {"const": "json_schema"}}},
            "then": {"required": ["json_schema"]}}


_NATIVE_STRUCTURED = {
    "response_format": _response_format(_JSON_SCHEMA),
    "guided_json": {**_JSON_SCHEMA, "type": ["object", "null"]},
}
_OPENAI_RESPONSE_FORMAT = _response_format({
    "type": "object", "required": ["schema"],
    "properties": {"name": {"type": "string"}, "description": {"type": "string"},
                   "schema": _JSON_SCHEMA, "strict": {"type": ["boolean", "null"]}}})


def _variant(title: str, key: str, schema: dict) -> dict:
    return {"title": title, "type": "object", "required": [key],
            "properties": {key: schema, **_GENERATION_OPTIONS, **_NATIVE_STRUCTURED}}


# Every sampling option at once: what a client may combine, and what the fuzz tests send.
_SAMPLED = {"max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 7,
            "repetition_penalty": 1.1, "frequency_penalty": 0.5, "presence_penalty": 0.5,
            "stop": ["\n\n"]}
_QUESTION = [{"role": "system", "content": "Answer in one word."},
             {"role": "user", "content": "What is the capital of France?"}]

# Exactly one of prompt and messages (edgefire.runtime.server.prompts says so when both are given).
TEXT_GENERATION_INPUT = {
    "type": "object",
    "oneOf": [_variant("Prompt", "prompt", _TEXT), _variant("Messages", "messages", _MESSAGES)],
    "examples": [{"prompt": "Tell me a joke.", **_SAMPLED},
                 {"messages": _QUESTION, "stream": True, **_SAMPLED}],
}

_USAGE = {"type": "object", "properties": {
    "prompt_tokens": {"type": "integer"},
    "completion_tokens": {"type": "integer"},
    "total_tokens": {"type": "integer"},
    "prompt_tokens_details": {"type": "object", "properties": {
        "cached_tokens": {"type": "integer"}}},
}}

TEXT_GENERATION_OUTPUT = {"oneOf": [
    {"type": "object", "contentType": "application/json",
     "properties": {
         "response": {"type": ["string", "object", "array", "number", "boolean", "null"],
                      "description": "text; in JSON mode the parsed JSON value"},
         "finish_reason": {"enum": ["stop", "length"]},
         "usage": _USAGE}},
    {"type": "string", "contentType": "text/event-stream", "format": "binary"},
]}

_TEXTS = {"oneOf": [_TEXT, {"type": "array", "items": _TEXT, "minItems": 1,
                            "maxItems": MAX_TEXTS}]}

TEXT_EMBEDDINGS_INPUT = {
    "type": "object", "required": ["text"],
    "examples": [{"text": ["A cat sat.", "A dog ran."]}],
    "properties": {
        "text": _TEXTS,
        # Which one a model takes is its own (catalog `pooling`); the route checks it.
        "pooling": {"type": ["string", "null"], "enum": ["mean", "cls", None],
                    "default": "mean"},
    },
}

TEXT_EMBEDDINGS_OUTPUT = {
    "type": "object", "contentType": "application/json",
    "properties": {
        "shape": {"type": "array", "items": {"type": "integer"}},
        "data": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
        "pooling": {"type": "string", "enum": ["mean", "cls"]},
    },
}

TASK_SCHEMAS = {  # task: (input, output)
    TEXT_GENERATION: (TEXT_GENERATION_INPUT, TEXT_GENERATION_OUTPUT),
    TEXT_EMBEDDINGS: (TEXT_EMBEDDINGS_INPUT, TEXT_EMBEDDINGS_OUTPUT),
}

_MODEL = {"type": "string", "description": "a catalog model id, e.g. @cf/meta/llama-3.1-8b"}

CHAT_COMPLETIONS_REQUEST = {
    "type": "object", "required": ["model", "messages"],
    "properties": {
        "model": _MODEL,
        "messages": _MESSAGES,
        "n": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_CHOICES, "default": 1},
        "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1,
                                  "description": "wins over max_tokens"},
        "stream_options": {"type": ["object", "null"], "properties": {
            "include_usage": _flag("a last chunk with the usage of the whole call")}},
        "response_format": _OPENAI_RESPONSE_FORMAT,
        **_GENERATION_OPTIONS,
    },
}

EMBEDDINGS_REQUEST = {
    "type": "object", "required": ["model", "input"],
    "properties": {
        "model": _MODEL,
        "input": _TEXTS,
        "encoding_format": {"type": ["string", "null"], "enum": [*ENCODINGS, None],
                            "default": "float"},
    },
}

_COUNT = {"type": "integer", "minimum": 0}

# What a node reports every few seconds (edgefire.runtime.node.heartbeat;
# edgefire.gateway.routing.directory).
HEARTBEAT = {
    "type": "object",
    "required": ["city", "url", "lat", "lon", "memory_budget_bytes", "accelerator_bytes"],
    "properties": {
        "city": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$",
                 "description": "1-64 letters, digits, '-' or '_'"},
        "url": {"type": "string", "pattern": "^https?://", "maxLength": 2048,
                "description": "an http(s) origin, where the gateway reaches the node"},
        "lat": {"type": "number", "minimum": -90, "maximum": 90},
        "lon": {"type": "number", "minimum": -180, "maximum": 180},
        "memory_budget_bytes": _COUNT,
        "accelerator_bytes": _COUNT,
        "loaded_models": {"type": "object", "additionalProperties": {"type": "object"},
                          "propertyNames": {"maxLength": 256}},
        "running": _COUNT,
        "waiting": _COUNT,
        "kv_usage": {"type": "number", "minimum": 0, "maximum": 1},
        "name": {"type": ["string", "null"], "maxLength": 128},
        "role": {"enum": ["prefill", "decode", "both", None]},
        "status": {"enum": ["ok", "degraded", "starting", None],
                   "description": "starting nodes are not routed to; degraded ones last"},
        "accelerators": {
            "type": ["object", "null"], "required": ["kind", "count"],
            "additionalProperties": False,
            "description": "the city's declared accelerators, which the capacity planner "
                           "places models on; absent: placed by memory budget alone",
            "properties": {"kind": {"type": "string", "pattern": "^[a-z0-9-]{1,64}$"},
                           "count": {"type": "integer", "minimum": 1, "maximum": 64}}},
    },
}
