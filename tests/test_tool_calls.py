"""Tool calling over real HTTP with SmolLM2: native and OpenAI forms, tool_choice each way,
streams, and a multi-turn loop with the official openai client."""

from __future__ import annotations

import json

import httpx
import jsonschema_rs
import openai
import pytest

from edgefire.contract.cities import load_city
from edgefire.contract.tools import Tool, ToolChoice
from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.node.settings import NodeSettings
from edgefire.runtime.server import create_app
from edgefire.runtime.server.tool_calls import answer_schema, read_answer

SMOL = "@cf/huggingfacetb/smollm2-135m-instruct"
RUN = f"/client/v4/accounts/acct/ai/run/{SMOL}"
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 32},
    "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"],
    "additionalProperties": False}
TIME = {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 32}},
        "required": ["timezone"], "additionalProperties": False}
# The native legacy form and the OpenAI form, as Workers AI takes both.
NATIVE_TOOLS = [{"name": "get_weather", "description": "The weather in a city now",
                 "parameters": WEATHER},
                {"name": "get_time", "description": "The time in a time zone",
                 "parameters": TIME}]
OPENAI_TOOLS = [{"type": "function", "function": tool} for tool in NATIVE_TOOLS]
PARAMETERS = {"get_weather": WEATHER, "get_time": TIME}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def _valid_calls(calls: list[dict], names: set[str]) -> None:
    assert calls
    for call in calls:
        assert call["name"] in names
        assert jsonschema_rs.validator_for(PARAMETERS[call["name"]]).is_valid(call["arguments"])


def test_a_call_is_one_of_the_tools_with_arguments_valid_against_it():
    schema = answer_schema(tuple(Tool(t["name"], "", t["parameters"]) for t in NATIVE_TOOLS),
                           ToolChoice("required", None, parallel=False))
    call = {"name": "get_time", "arguments": {"timezone": "UTC"}}
    assert jsonschema_rs.validator_for(schema).is_valid({"tool_calls": [call]})
    assert not jsonschema_rs.validator_for(schema).is_valid({"tool_calls": [call, call]})
    assert not jsonschema_rs.validator_for(schema).is_valid(
        {"tool_calls": [{"name": "get_time", "arguments": {"city": "Paris"}}]})


def test_an_answer_cut_by_max_tokens_keeps_its_words_and_makes_no_call():
    assert read_answer('{"response": "It is sunny in Par').text == "It is sunny in Par"
    assert read_answer('{"response": "a\\u00e9b\\u00').text == "a\u00e9b"
    cut = '{"tool_calls": [{"name": "get_time", "argu'
    assert (read_answer(cut).text, read_answer(cut).calls) == (cut, [])


@pytest.fixture(scope="module")
def base_url(serve):
    node = EdgeNode(load_city("fra"), NodeSettings(kv_cache_mib=256))
    with serve(create_app(node)) as url:
        yield url


@pytest.mark.slow
class TestOverHTTP:
    def _run(self, base_url: str, **inputs) -> dict:
        response = httpx.post(base_url + RUN, json={"messages": QUESTION, "max_tokens": 96,
                                                     "tools": NATIVE_TOOLS, **inputs},
                              timeout=120)
        assert response.status_code == 200, response.text
        return response.json()["result"]

    @pytest.mark.parametrize("temperature", [0.0, 0.8])
    def test_native_required_and_named_calls(self, base_url, temperature):
        # Sampled, a parallel answer may list calls until max_tokens: one call is asked for
        # there (the grammar allows exactly one), any number when greedy.
        result = self._run(base_url, tool_choice="required", temperature=temperature,
                           parallel_tool_calls=temperature == 0, max_tokens=160, seed=1)
        assert result["finish_reason"] == "tool_calls" and result["response"] == ""
        _valid_calls(result["tool_calls"], set(PARAMETERS))
        if temperature:
            assert len(result["tool_calls"]) == 1
        named = self._run(base_url, temperature=temperature, parallel_tool_calls=False, seed=1,
                          tool_choice={"type": "function", "function": {"name": "get_time"}})
        assert len(named["tool_calls"]) == 1
        _valid_calls(named["tool_calls"], {"get_time"})

    def test_native_none_answers_in_words_and_auto_either_way(self, base_url):
        words = self._run(base_url, tool_choice="none", temperature=0)
        assert "tool_calls" not in words and words["response"]
        auto = self._run(base_url, temperature=0)
        if auto["tool_calls"]:
            assert auto["finish_reason"] == "tool_calls"
            _valid_calls(auto["tool_calls"], set(PARAMETERS))
        else:  # words, whole or cut by max_tokens as a free answer would be
            assert auto["response"] and auto["finish_reason"] in ("stop", "length")

    def test_native_stream_sends_whole_calls(self, base_url):
        with httpx.stream("POST", base_url + RUN, timeout=120, json={
                "messages": QUESTION, "tools": NATIVE_TOOLS, "tool_choice": "required",
                "stream": True, "max_tokens": 160, "temperature": 0}) as response:
            events = [json.loads(line.removeprefix("data: ")) for line in response.iter_lines()
                      if line.startswith("data: {")]
        [with_calls] = [e for e in events if e.get("tool_calls")]
        _valid_calls(with_calls["tool_calls"], set(PARAMETERS))
        assert events[-1]["finish_reason"] == "tool_calls" and events[-1]["usage"]

    def test_openai_client_loop(self, base_url):
        client = openai.OpenAI(base_url=f"{base_url}/client/v4/accounts/acct/ai/v1",
                               api_key="unused", max_retries=0, timeout=120)
        messages = list(QUESTION)
        first = client.chat.completions.create(model=SMOL, messages=messages,
                                               tools=OPENAI_TOOLS, tool_choice="required",
                                               max_tokens=160, temperature=0)
        [choice] = first.choices
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        calls = choice.message.tool_calls
        for call in calls:
            assert call.id.startswith("call_") and call.type == "function"
            _valid_calls([{"name": call.function.name,
                           "arguments": json.loads(call.function.arguments)}], set(PARAMETERS))
        # Feed the results back, as an agent loop does; the model then answers in words.
        messages.append(choice.message.model_dump(exclude_none=True))
        messages += [{"role": "tool", "tool_call_id": call.id,
                      "content": json.dumps({"temperature": 18, "unit": "celsius"})}
                     for call in calls]
        second = client.chat.completions.create(model=SMOL, messages=messages,
                                                tools=OPENAI_TOOLS, tool_choice="none",
                                                max_tokens=48, temperature=0)
        assert second.choices[0].message.content and not second.choices[0].message.tool_calls
        assert second.choices[0].finish_reason in ("stop", "length")

    def test_openai_stream_carries_tool_calls(self, base_url):
        client = openai.OpenAI(base_url=f"{base_url}/client/v4/accounts/acct/ai/v1",
                               api_key="unused", max_retries=0, timeout=120)
        chunks = list(client.chat.completions.create(
            model=SMOL, messages=QUESTION, tools=OPENAI_TOOLS, stream=True, max_tokens=160,
            temperature=0,
            tool_choice={"type": "function", "function": {"name": "get_weather"}}))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        [calls] = [d.tool_calls for d in deltas if d.tool_calls]
        assert calls[0].function.name == "get_weather" and calls[0].id.startswith("call_")
        arguments = json.loads(calls[0].function.arguments)
        _valid_calls([{"name": "get_weather", "arguments": arguments}], {"get_weather"})
        assert chunks[-1].choices[0].finish_reason == "tool_calls"

    @pytest.mark.parametrize(("inputs", "field"), [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"response_format": {"type": "json_object"}}, "tools"),
        ({"tools": NATIVE_TOOLS + NATIVE_TOOLS[:1]}, "tools"),
        ({"tools": [], "tool_choice": "required"}, "tool_choice"),
    ])
    def test_contradictions_are_refused_by_name(self, base_url, inputs, field):
        response = httpx.post(base_url + RUN, timeout=120, json={
            "messages": QUESTION, "tools": NATIVE_TOOLS, **inputs})
        assert response.status_code == 400, response.text
        [error] = response.json()["errors"]
        assert error["code"] == 5006 and field in error["message"]

    def test_parallel_calls_in_one_answer(self, base_url):
        client = openai.OpenAI(base_url=f"{base_url}/client/v4/accounts/acct/ai/v1",
                               api_key="unused", max_retries=0, timeout=120)
        # Eight seeded samples of one question that needs two calls: SmolLM2 makes both in
        # some of them (greedy, it stops after the first).
        completion = client.chat.completions.create(
            model=SMOL, messages=[{"role": "user",
                                   "content": "What is the weather in Paris and in London?"}],
            tools=OPENAI_TOOLS[:1], tool_choice="required", max_tokens=200, temperature=0.8,
            seed=0, n=8)
        counts = []
        for choice in completion.choices:
            calls = choice.message.tool_calls
            if choice.finish_reason == "length":  # sampled past max_tokens: no call, as OpenAI
                assert not calls and choice.message.content
                continue
            assert choice.finish_reason == "tool_calls"
            assert len({call.id for call in calls}) == len(calls)
            _valid_calls([{"name": c.function.name, "arguments": json.loads(c.function.arguments)}
                          for c in calls], {"get_weather"})
            counts.append(len(calls))
        assert max(counts) >= 2, counts
