"""Tool calling's inputs: the tools a request offers, which it lets the model call, and the
assistant turns of earlier calls, in both families' forms.

Workers AI's native models take `tools` as `{name, description, parameters}` or, like the
OpenAI family, as `{type: "function", function: {...}}`; both become one Tool. A past assistant
turn's calls become text the model can read back: the JSON it answers calls with (see
edgefire.runtime.server.tool_calls).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

from edgefire.contract.bodies import given
from edgefire.contract.errors import InvalidInputError

# A tool whose parameters are not given takes no arguments.
NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(slots=True, frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # the JSON Schema of its arguments object


@dataclass(slots=True, frozen=True)
class ToolChoice:
    mode: str = "auto"  # "auto", "none", "required" or "function" (the one named below)
    name: str | None = None
    parallel: bool = True  # more than one call in an answer (parallel_tool_calls)


def parse_tools(body: dict[str, Any]) -> tuple[tuple[Tool, ...], ToolChoice]:
    """The tools of a schema-checked body and the choice it makes among them."""
    tools: list[Tool] = []
    for i, item in enumerate(given(body, "tools", [])):
        spec = item.get("function", item)
        if any(t.name == spec["name"] for t in tools):
            raise InvalidInputError(f"tools[{i}] repeats the name {spec['name']!r}",
                                    field="tools")
        tools.append(Tool(spec["name"], spec.get("description") or "",
                          spec.get("parameters") or NO_ARGUMENTS))
    parallel = given(body, "parallel_tool_calls", True)
    raw = given(body, "tool_choice", "auto" if tools else "none")
    if isinstance(raw, dict):
        name = raw["function"]["name"]
        if not any(t.name == name for t in tools):
            raise InvalidInputError(f"tool_choice names {name!r}, which is not in tools",
                                    field="tool_choice")
        return tuple(tools), ToolChoice("function", name, parallel)
    if raw in ("auto", "required") and not tools:
        raise InvalidInputError(f"tool_choice {raw!r} needs tools", field="tool_choice")
    return tuple(tools), ToolChoice(raw, None, parallel)


def calls_as_text(calls: list[dict[str, Any]]) -> str:
    """An earlier assistant turn's calls, native (`{name, arguments: object}`) or OpenAI
    (`{id, function: {name, arguments: JSON text}}`), as the JSON the model answers with."""
    plain = []
    for call in calls:
        spec = call.get("function", call)
        arguments = spec.get("arguments", {})
        if isinstance(arguments, str):
            with contextlib.suppress(ValueError):  # else kept as the text the client sent
                arguments = json.loads(arguments)
        plain.append({"name": spec.get("name", ""), "arguments": arguments})
    return json.dumps({"tool_calls": plain}, ensure_ascii=False)
