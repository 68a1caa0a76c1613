"""Tool calling for models without a tool-call format of their own (SmolLM2's chat template
renders no tools), the way llama.cpp's generic format does it: the tools are described in a
system message, and the answer is held by grammar-constrained decoding to one JSON object,
`{"tool_calls": [{"name", "arguments"}, …]}` or, where the model may choose, `{"response": …}`.
Each call's arguments are held to its tool's `parameters` schema, so every call is well formed.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, replace
from typing import Any

from edgefire.contract.text_generation import TextGenerationRequest
from edgefire.contract.tools import Tool, ToolChoice

_INSTRUCTIONS = (
    "You can call these tools (JSON Schema of each one's arguments):\n{tools}\n"
    "{how}")
_CALL = 'To call tools, answer with JSON: {"tool_calls": [{"name": ..., "arguments": {...}}]}.'
_OR_ANSWER = ' To answer without a tool, answer with JSON: {"response": "your answer"}.'
_WORDS = '{"response": "'  # how an answer in words starts, in the engine's JSON layout


@dataclass(slots=True)
class ToolAnswer:
    text: str  # the answer in words ("" when the model called tools)
    calls: list[dict[str, Any]]  # [{name, arguments: object}], in the order they were made


def prepare(request: TextGenerationRequest) -> TextGenerationRequest:
    """The request as the engine runs it: its tools described first, its answer constrained."""
    if not request.calls_tools:
        return request
    selected = _selected(request.tools, request.tool_choice)
    how = _CALL + (_OR_ANSWER if request.tool_choice.mode == "auto" else "")
    described = json.dumps([{"name": t.name, "description": t.description,
                             "parameters": t.parameters} for t in selected],
                           ensure_ascii=False)
    system = _INSTRUCTIONS.format(tools=described, how=how)
    messages = request.prompt.messages or [{"role": "user", "content": request.prompt.prompt}]
    if messages[0]["role"] == "system":  # one system turn: the client's, then the tools
        messages = [{**messages[0], "content": f"{messages[0]['content']}\n\n{system}"},
                    *messages[1:]]
    else:
        messages = [{"role": "system", "content": system}, *messages]
    sampling = {**request.sampling, "json_schema": answer_schema(request.tools,
                                                                 request.tool_choice),
                "json_schema_field": "tools"}
    return replace(request, prompt=replace(request.prompt, prompt=None, messages=messages),
                   sampling=sampling)


def answer_schema(tools: tuple[Tool, ...], choice: ToolChoice) -> dict[str, Any]:
    """The JSON Schema an answer to these tools is held to."""
    call = {"anyOf": [{"type": "object", "properties": {
        "name": {"const": t.name}, "arguments": t.parameters},
        "required": ["name", "arguments"], "additionalProperties": False}
        for t in _selected(tools, choice)]}
    calls = {"type": "array", "items": call, "minItems": 1}
    if not choice.parallel:
        calls["maxItems"] = 1
    tool_calls = {"type": "object", "properties": {"tool_calls": calls},
                  "required": ["tool_calls"], "additionalProperties": False}
    if choice.mode != "auto":
        return tool_calls
    response = {"type": "object", "properties": {"response": {"type": "string"}},
                "required": ["response"], "additionalProperties": False}
    return {"anyOf": [tool_calls, response]}


def read_answer(text: str) -> ToolAnswer:
    """The calls (or the words) in an answer made under answer_schema. The grammar makes every
    whole answer parse, so one that does not was cut by max_tokens: words are kept as a free
    answer's would be, a cut call is no call (its text is returned, finish_reason "length")."""
    try:
        answer = json.loads(text)
    except ValueError:
        if text.startswith(_WORDS):
            return ToolAnswer(_string_prefix(text[len(_WORDS):]), [])
        return ToolAnswer(text, [])
    if "tool_calls" in answer:
        return ToolAnswer("", answer["tool_calls"])
    return ToolAnswer(answer["response"], [])


def _string_prefix(body: str) -> str:
    """The text of a JSON string cut anywhere, an escape sequence included."""
    for cut in range(len(body), max(len(body) - 6, -1), -1):
        try:
            return json.loads(f'"{body[:cut]}"')
        except ValueError:
            continue
    return ""


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _selected(tools: tuple[Tool, ...], choice: ToolChoice) -> list[Tool]:
    if choice.mode == "function":
        return [t for t in tools if t.name == choice.name]
    return list(tools)
