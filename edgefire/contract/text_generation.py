"""A text-generation request, parsed once: Workers AI's run inputs or an OpenAI chat body.

The body is checked against its schema (edgefire.contract.schemas), then read into one typed
request that both API styles share; the node turns it into token ids and engine sampling
parameters, the gateway needs no more than the schema check. Rules a schema cannot state
live here: prompt and messages both given, the first max-tokens key that wins, JSON mode's
schema in either family's form, and the fields this engine does not do (refused, never ignored).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from edgefire.contract.bodies import given
from edgefire.contract.errors import InvalidInputError
from edgefire.contract.schemas import CHAT_COMPLETIONS_REQUEST, TASK_SCHEMAS, TEXT_GENERATION
from edgefire.contract.tools import Tool, ToolChoice, calls_as_text, parse_tools
from edgefire.contract.validation import Checker

_RUN = Checker(TASK_SCHEMAS[TEXT_GENERATION][0])
_CHAT = Checker(CHAT_COMPLETIONS_REQUEST)

# Checked by the schema; what depends on the model (top_k against its vocabulary) is checked
# by the engine's SamplingParams.validate.
_SAMPLING_FIELDS = ("temperature", "top_p", "repetition_penalty", "frequency_penalty",
                    "presence_penalty")
# JSON Schema counts 2.0 as an integer; the engine wants Python ints.
_INTEGER_FIELDS = ("top_k", "seed")
# JSON mode without a schema: any JSON object (as OpenAI's and Workers AI's json_object).
ANY_OBJECT = {"type": "object"}

# Fields of Workers AI's and OpenAI's schemas that this engine does not do: asking for one is
# answered 5006 naming it, so no client mistakes a free-text answer for what it asked.
_UNSUPPORTED_RUN = ("functions", "lora", "image")
_UNSUPPORTED_CHAT = ("functions", "function_call", "logprobs",
                     "top_logprobs", "logit_bias", "audio", "modalities", "prediction",
                     "web_search_options", "reasoning_effort", "chat_template_kwargs")
# Values that ask for nothing (`tool_choice: "none"`, `logprobs: false`) pass.
_ASKS_NOTHING = (None, False, "none", 0, "", [], {})


@dataclass(slots=True, frozen=True)
class PromptInput:
    prompt: str | None = None  # exactly one of prompt and messages is set
    messages: list[dict[str, Any]] | None = None
    raw: bool = False  # skip the chat template


@dataclass(slots=True, frozen=True)
class TextGenerationRequest:
    prompt: PromptInput
    # Keyword arguments of the engine's SamplingParams; absent ones take Workers AI defaults.
    sampling: dict[str, Any] = field(default_factory=dict)
    n: int = 1  # choices (OpenAI's `n`)
    stream: bool = False
    include_usage: bool = False  # OpenAI's stream_options.include_usage
    reject_if_busy: bool = False  # Workers AI's options.rejectIfBusy
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = field(default_factory=lambda: ToolChoice("none"))

    @property
    def calls_tools(self) -> bool:
        """The model may (or must) answer with tool calls."""
        return bool(self.tools) and self.tool_choice.mode != "none"

    @property
    def json_mode(self) -> bool:
        """The answer is one JSON value (response_format json_object / json_schema)."""
        return self.sampling.get("json_schema") is not None


def parse_run(body: dict[str, Any]) -> TextGenerationRequest:
    """Workers AI's `POST …/ai/run/{model}` inputs (5006 naming the field if they do not fit)."""
    body = _RUN.check(body)
    _refuse(body, _UNSUPPORTED_RUN)
    sampling = _sampling(body, ("max_tokens",))
    schema = _native_schema(body)
    stream = given(body, "stream", False)
    if schema is not None:
        if stream:  # as Workers AI: the answer is one parsed object, not a stream of text
            raise InvalidInputError("JSON mode does not support streaming", field="stream")
        sampling["json_schema"] = schema
    return _with_tools(body, TextGenerationRequest(
        _prompt(body, allow_prompt=True), sampling, stream=stream,
        reject_if_busy=_reject_if_busy(body)))


def parse_chat(body: dict[str, Any]) -> TextGenerationRequest:
    """An OpenAI `POST …/v1/chat/completions` body (its `model` is read by the caller)."""
    body = _CHAT.check(body)
    _refuse(body, _UNSUPPORTED_CHAT)
    sampling = _sampling(body, ("max_completion_tokens", "max_tokens"))
    schema = _format_schema(given(body, "response_format"), lambda spec: spec["schema"])
    if schema is not None:
        sampling["json_schema"] = schema
    return _with_tools(body, TextGenerationRequest(
        _prompt(body, allow_prompt=False), sampling,
        n=int(given(body, "n", 1)), stream=given(body, "stream", False),
        include_usage=given(given(body, "stream_options", {}), "include_usage", False),
        reject_if_busy=_reject_if_busy(body)))


def _with_tools(body: dict[str, Any], request: TextGenerationRequest) -> TextGenerationRequest:
    tools, choice = parse_tools(body)
    request = replace(request, tools=tools, tool_choice=choice)
    if request.calls_tools:
        # Both shape the whole answer: a tool call is JSON of its own form.
        if request.json_mode:
            raise InvalidInputError("tools cannot be combined with JSON mode", field="tools")
        if request.prompt.raw:
            raise InvalidInputError("tools need the chat template; raw skips it",
                                    field="tools")
    return request


def _native_schema(body: dict[str, Any]) -> dict | None:
    """JSON mode's schema from `response_format` (a bare schema) or `guided_json`."""
    guided = given(body, "guided_json")
    response_format = given(body, "response_format")
    if guided is not None and response_format is not None:
        raise InvalidInputError("guided_json cannot be given with response_format",
                                field="guided_json")
    return guided if guided is not None else _format_schema(response_format, lambda s: s)


def _format_schema(response_format: dict | None,
                   unwrap: Callable[[dict], dict]) -> dict | None:
    kind = (response_format or {}).get("type", "text")
    if kind == "json_object":
        return ANY_OBJECT
    if kind == "json_schema":
        return unwrap(response_format["json_schema"])
    return None


def _refuse(body: dict[str, Any], unsupported: tuple[str, ...]) -> None:
    for name in unsupported:
        if body.get(name) not in _ASKS_NOTHING:
            raise InvalidInputError(f"{name} is not supported by this model", field=name)


def _prompt(body: dict[str, Any], *, allow_prompt: bool) -> PromptInput:
    raw = given(body, "raw", False)
    prompt = given(body, "prompt") if allow_prompt else None
    messages = given(body, "messages")
    if prompt is not None:
        # Cross-field: the Prompt variant lets other keys through, as Workers AI's schema does.
        if messages is not None:
            raise InvalidInputError("prompt cannot be given with messages", field="prompt")
        return PromptInput(prompt=prompt, raw=raw)
    return PromptInput(messages=[{**m, "content": _message_text(m)} for m in messages], raw=raw)


def _sampling(body: dict[str, Any], max_tokens_keys: tuple[str, ...]) -> dict[str, Any]:
    """Sampling inputs given; the first max_tokens key given wins."""
    fields = {name: body[name] for name in _SAMPLING_FIELDS if body.get(name) is not None}
    fields |= {name: int(body[name]) for name in _INTEGER_FIELDS if body.get(name) is not None}
    for key in max_tokens_keys:
        if body.get(key) is not None:
            fields["max_tokens"] = int(body[key])
            break
    stop = body.get("stop")
    if stop is not None:
        fields["stop"] = [stop] if isinstance(stop, str) else stop
    return fields


def _reject_if_busy(body: dict[str, Any]) -> bool:
    """`options.rejectIfBusy`: a sibling of the model inputs, never one of them."""
    return given(given(body, "options", {}), "rejectIfBusy", False)


def _message_text(message: dict[str, Any]) -> str:
    """A message's content as text: its text parts joined; an assistant turn's tool calls as
    the JSON the model answers calls with."""
    content = message.get("content")
    if message.get("tool_calls"):
        return calls_as_text(message["tool_calls"])
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part["text"] for part in content)
