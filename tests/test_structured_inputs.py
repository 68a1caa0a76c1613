"""JSON mode's inputs in both families, and the fields this engine refuses rather than ignores."""

from __future__ import annotations

import pytest

from edgefire.contract.errors import InvalidInputError
from edgefire.contract.text_generation import ANY_OBJECT, parse_chat, parse_run

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
MESSAGES = [{"role": "user", "content": "hi"}]


def _refused(parse, body: dict, field: str) -> str:
    with pytest.raises(InvalidInputError) as info:
        parse(body)
    assert info.value.field == field and info.value.code == 5006
    return info.value.message


@pytest.mark.parametrize(("extra", "schema"), [
    ({}, None),
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, ANY_OBJECT),
    ({"response_format": {"type": "json_schema", "json_schema": SCHEMA}}, SCHEMA),
    ({"guided_json": SCHEMA}, SCHEMA),
])
def test_native_json_mode_takes_a_bare_schema(extra, schema):
    request = parse_run({"prompt": "x", **extra})
    assert request.sampling.get("json_schema") == schema
    assert request.json_mode is (schema is not None)


def test_openai_json_schema_is_unwrapped():
    request = parse_chat({"model": "m", "messages": MESSAGES, "response_format": {
        "type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}}})
    assert request.sampling["json_schema"] == SCHEMA
    # The OpenAI family streams JSON mode as text; the native family refuses, as Workers AI.
    assert parse_chat({"model": "m", "messages": MESSAGES, "stream": True,
                       "response_format": {"type": "json_object"}}).stream
    message = _refused(parse_run, {"prompt": "x", "stream": True,
                                   "response_format": {"type": "json_object"}}, "stream")
    assert "streaming" in message


@pytest.mark.parametrize(("parse", "body", "field"), [
    (parse_run, {"prompt": "x", "guided_json": SCHEMA,
                 "response_format": {"type": "json_object"}}, "guided_json"),
    (parse_run, {"prompt": "x", "response_format": {"type": "json_schema"}}, "response_format"),
    (parse_run, {"prompt": "x", "response_format": {"type": "yaml"}}, "response_format.type"),
    (parse_chat, {"model": "m", "messages": MESSAGES, "response_format": {
        "type": "json_schema", "json_schema": {"name": "bare"}}}, "response_format.json_schema"),
])
def test_malformed_json_mode_is_refused_by_name(parse, body, field):
    with pytest.raises(InvalidInputError) as info:
        parse(body)
    assert info.value.field.startswith(field.split(".")[0])


@pytest.mark.parametrize(("parse", "base", "field", "value"), [
    (parse_run, {"prompt": "x"}, "functions", [{"name": "f", "code": "return 1"}]),
    (parse_run, {"prompt": "x"}, "lora", "my-adapter"),
    (parse_run, {"prompt": "x"}, "image", [1, 2, 3]),
    (parse_chat, {"model": "m", "messages": MESSAGES}, "function_call", "auto"),
    (parse_chat, {"model": "m", "messages": MESSAGES}, "logprobs", True),
    (parse_chat, {"model": "m", "messages": MESSAGES}, "logit_bias", {"50256": -100}),
    (parse_chat, {"model": "m", "messages": MESSAGES}, "reasoning_effort", "high"),
])
def test_unsupported_fields_are_refused_not_ignored(parse, base, field, value):
    message = _refused(parse, {**base, field: value}, field)
    assert message == f"{field} is not supported by this model"


@pytest.mark.parametrize(("field", "value"), [
    ("tool_choice", "none"), ("logprobs", False), ("tools", []), ("top_logprobs", 0)])
def test_values_that_ask_for_nothing_pass(field, value):
    parse_chat({"model": "m", "messages": MESSAGES, field: value})
