"""HTTP API without running a model: routing, errors and their envelopes, catalog, health, auth."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid

import httpx
import jsonschema_rs
import pytest

from edgefire.contract.catalog_api import model_object, published_precision
from edgefire.contract.cities import load_city
from edgefire.runtime.engine.sampling_params import MAX_STOP_CHARS, MAX_STOP_STRINGS
from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.node.settings import NodeSettings
from edgefire.runtime.server import create_app
from edgefire.runtime.server.generation import TextGenerator
from edgefire.runtime.server.metrics import ServerMetrics
from edgefire.runtime.weight_precision import compute_precision

API = "/client/v4/accounts/acct/ai"
SMOL = "@cf/huggingfacetb/smollm2-135m-instruct"
SMOL_INT8, SMOL_INT4, SMOL_UNWEIGHT = f"{SMOL}-int8", f"{SMOL}-int4", f"{SMOL}-unweight"
MINILM = "@cf/sentence-transformers/all-minilm-l6-v2"


@pytest.fixture(scope="module")
def node() -> EdgeNode:
    return EdgeNode(load_city("fra"), NodeSettings(kv_cache_mib=256))


@pytest.fixture(scope="module")
def client(node, serve):
    with serve(create_app(node)) as base_url, httpx.Client(base_url=base_url) as client:
        yield client


def _error(response: httpx.Response, status: int, code: int) -> str:
    """The message of a Workers AI error envelope, after checking its shape."""
    assert response.status_code == status, response.text
    body = response.json()
    assert body["success"] is False and body["result"] is None and body["messages"] == []
    [error] = body["errors"]
    assert error["code"] == code, body
    return error["message"]


def _openai_error(response: httpx.Response, status: int, code: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == str(code) and error["type"] and error["message"]
    return error


def test_health_is_503_until_the_node_is_ready():
    node = EdgeNode(load_city("fra"), NodeSettings(kv_cache_mib=256))

    async def get() -> httpx.Response:  # ASGITransport runs no lifespan: never started
        transport = httpx.ASGITransport(app=create_app(node))
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as client:
            return await client.get("/health")

    response = asyncio.run(get())
    assert response.status_code == 503 and response.json()["status"] == "starting"


def test_health_when_ready(client):
    body = client.get("/health").json()
    assert body["status"] == "ok" and body["city"] == "fra" and body["loaded_models"] == {}


def test_metrics_exposition_names(client):
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith(
        "text/plain")
    for name in ("requests_running gauge", "requests_waiting gauge",
                 "kv_cache_usage_ratio gauge", "kv_blocks_in_use gauge",
                 "prefix_cache_queries_total counter",
                 "prefix_cache_hits_total counter", "preemptions_total counter",
                 "spec_decode_draft_tokens_total counter",
                 "spec_decode_accepted_tokens_total counter",
                 "prompt_tokens_total counter", "generation_tokens_total counter",
                 "requests_total counter", "time_to_first_token_seconds histogram",
                 "inter_token_latency_seconds histogram",
                 "e2e_request_latency_seconds histogram"):
        assert f"# TYPE edgefire_{name}\n" in response.text, name


def test_unknown_route_gets_an_envelope(client):
    assert _error(client.get("/nope"), 404, 7000) == "No route for that URI"
    _error(client.get(f"{API}/run/{SMOL}"), 405, 7001)
    _openai_error(client.get(f"{API}/v1/nope"), 404, 7000)


def test_unknown_model_is_5007(client):
    message = _error(client.post(f"{API}/run/@cf/acme/nope", json={"prompt": "x"}), 400, 5007)
    assert message == "No such model @cf/acme/nope or task"
    error = _openai_error(client.post(f"{API}/v1/chat/completions", json={
        "model": "@cf/acme/nope", "messages": [{"role": "user", "content": "x"}]}), 400, 5007)
    assert error["param"] == "model" and error["type"] == "invalid_request_error"
    # A known model of another task is "no such model or task" too.
    _openai_error(client.post(f"{API}/v1/embeddings", json={"model": SMOL, "input": "x"}),
                  400, 5007)


def test_planning_only_model_is_refused(client, node):
    planned = [spec.id for spec in node.catalog.specs if not spec.runnable]
    if not planned:
        pytest.skip("the catalog lists no planning-only model")
    message = _error(client.post(f"{API}/run/{planned[0]}", json={"prompt": "x"}), 400, 5018)
    assert "planning only" in message


@pytest.mark.parametrize(("body", "field"), [
    (b"{not json", "body"),
    (b"[1, 2]", "body"),
    (b"{}", "messages"),
    (json.dumps({"prompt": 7}).encode(), "prompt"),
    (json.dumps({"prompt": ""}).encode(), "prompt"),
    (json.dumps({"prompt": "a", "messages": []}).encode(), "prompt"),
    (json.dumps({"messages": "hi"}).encode(), "messages"),
    (json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(),
     "messages[0].content"),
    (json.dumps({"messages": [{"content": "x"}]}).encode(), "messages[0].role"),
    (json.dumps({"prompt": "a", "raw": "yes"}).encode(), "raw"),
    (json.dumps({"prompt": "a", "stream": 1}).encode(), "stream"),
    (json.dumps({"prompt": "a", "seed": "s"}).encode(), "seed"),
    (json.dumps({"prompt": "a", "options": {"rejectIfBusy": "y"}}).encode(), "rejectIfBusy"),
    (b'{"prompt": "a", "temperature": NaN}', "body"),  # no JSON value, though Python reads it
])
def test_invalid_text_input_is_5006_naming_the_field(client, body, field):
    message = _error(client.post(f"{API}/run/{SMOL}", content=body), 400, 5006)
    assert field in message


# Each of these was a 500 (3001): input that reached code that could not take it.
@pytest.mark.parametrize(("request_args", "field"), [
    # An unpaired surrogate is no text: the tokenizer cannot take it,
    (("POST", f"{API}/run/{SMOL}", b'{"prompt": "\\udfff hi"}'), "body"),
    # nesting past Python's recursion limit,
    (("POST", f"{API}/run/{SMOL}", b"[" * 100_000 + b"]" * 100_000), "body"),
    # "²".isdigit() holds, yet int() refuses it.
    (("GET", f"{API}/models/search?per_page=%C2%B2", None), "per_page"),
])
def test_input_that_was_a_server_error_is_5006(client, request_args, field):
    method, path, body = request_args
    assert field in _error(client.request(method, path, content=body), 400, 5006)


def test_unpaired_surrogate_is_not_echoed_into_an_openai_error(client):
    # The model name went into the 5007 message, which then could not be encoded: a 500.
    body = b'{"model": "\\ud800", "messages": [{"role": "user", "content": "x"}]}'
    response = client.post(f"{API}/v1/chat/completions", content=body)
    assert _openai_error(response, 400, 5006)["param"] == "body"


@pytest.mark.parametrize(("text", "field"), [
    (None, "text"), ([], "text"), (["ok", ""], "text[1]"), (["x"] * 101, "text"), (3, "text"),
])
def test_invalid_embedding_input_is_5006(client, text, field):
    message = _error(client.post(f"{API}/run/{MINILM}", json={"text": text}), 400, 5006)
    assert field in message


def test_openai_invalid_input_names_the_param(client):
    chat = f"{API}/v1/chat/completions"
    messages = [{"role": "user", "content": "x"}]
    assert _openai_error(client.post(chat, json={"model": SMOL, "messages": messages, "n": 9}),
                         400, 5006)["param"] == "n"
    assert _openai_error(client.post(chat, json={"messages": messages}),
                         400, 5006)["param"] == "model"
    assert _openai_error(client.post(chat, json={"model": SMOL, "prompt": "x"}),
                         400, 5006)["param"] == "messages"
    embeddings = {"model": MINILM, "input": "x", "encoding_format": "hex"}
    assert _openai_error(client.post(f"{API}/v1/embeddings", json=embeddings),
                         400, 5006)["param"] == "encoding_format"


def test_no_room_to_load_a_model_is_3040(serve):
    city = dataclasses.replace(load_city("fra"), memory_budget_gib=0.1)  # under MiniLM's need
    node = EdgeNode(city, NodeSettings(kv_cache_mib=256))
    with serve(create_app(node)) as base_url:
        response = httpx.post(f"{base_url}{API}/run/{MINILM}", json={"text": "x"})
    assert "budget" in _error(response, 429, 3040)
    assert node.registry.num_loads == 0


def test_internal_error_is_3001_and_the_server_lives_on(client, node, monkeypatch):
    def fail(name: str):
        raise RuntimeError("a bug")

    monkeypatch.setattr(node.catalog, "get_runnable", fail)
    response = client.post(f"{API}/run/{SMOL}", json={"prompt": "x"})
    assert _error(response, 500, 3001) == "Internal server error" and "bug" not in response.text
    monkeypatch.undo()
    assert client.get("/health").status_code == 200


def test_request_over_the_size_limit_is_3006(client, node, monkeypatch):
    monkeypatch.setattr(node.settings, "max_request_bytes", 1000)
    body = json.dumps({"prompt": "x" * 5000}).encode()
    assert _error(client.post(f"{API}/run/{SMOL}", content=body), 413, 3006) == (
        "Request is too large")

    def chunked():  # no Content-Length: the limit applies to what is read
        yield body[:2000]
        yield body[2000:]

    _error(client.post(f"{API}/run/{SMOL}", content=chunked()), 413, 3006)
    _openai_error(client.post(f"{API}/v1/chat/completions", content=body), 413, 3006)


def test_node_secret_is_required_when_set(client, node, monkeypatch):
    monkeypatch.setattr(node.settings, "node_secret", "s3cret")
    search = f"{API}/models/search"
    assert _error(client.get(search), 401, 10000) == "Authentication error"
    _error(client.get(search, headers={"x-edgefire-node-secret": "wrong"}), 401, 10000)
    _openai_error(client.get(f"{API}/v1/models"), 401, 10000)
    assert client.get(search, headers={"x-edgefire-node-secret": "s3cret"}).status_code == 200
    assert client.get("/health").status_code == 200  # probes need no secret


def test_models_search(client, node):
    body = client.get(f"{API}/models/search").json()
    assert body["success"] is True
    assert body["result_info"] == {"page": 1, "per_page": 20, "count": len(node.catalog.specs),
                                   "total_count": len(node.catalog.specs)}
    by_name = {m["name"]: m for m in body["result"]}
    smol = by_name[SMOL]
    assert smol["id"] == str(uuid.uuid5(uuid.NAMESPACE_URL, SMOL)) and smol["source"] == 1
    assert smol["task"]["name"] == "Text Generation"
    assert smol["task"]["id"] == "c329a1f9-323d-4e91-b2aa-582dd4188d34"
    properties = {p["property_id"]: p["value"] for p in smol["properties"]}
    assert properties["context_window"] == "8192" and "planning_only" not in properties
    for spec in node.catalog.specs:
        shown = {p["property_id"]: p["value"] for p in by_name[spec.id]["properties"]}
        assert (shown.get("planning_only") == "true") is (not spec.runnable)
        if "price" in spec.extra:
            assert shown["price"] == spec.extra["price"]


def test_models_search_states_each_weight_precision(client, node):
    result = client.get(f"{API}/models/search").json()["result"]
    shown = {m["name"]: {p["property_id"]: p["value"] for p in m["properties"]} for m in result}
    compute = compute_precision(node.settings.dtype)
    expected = {SMOL: (compute, "identity"), SMOL_INT8: ("int8", "int8"),
                SMOL_INT4: ("int4-g32", "int4"), SMOL_UNWEIGHT: ("bfloat16-unweight", "unweight"),
                MINILM: ("float32", "identity"),
                # A miniature holds its seeded weights as the node computes, not as published.
                "@cf/moonshotai/kimi-k2.5": (compute, "identity")}
    for name, (precision, codec) in expected.items():
        assert (shown[name]["weight_precision"], shown[name]["weight_codec"]) == (precision, codec)
    # Planning-only models show their published dtype and no codec.
    assert shown["@cf/meta/llama-3.1-8b-instruct"]["weight_precision"] == "bfloat16"
    assert not any("weight_codec" in props for props in shown.values()
                   if props.get("planning_only"))


def test_the_gateways_catalog_states_only_published_precisions(node):
    # The gateway loads no codecs and holds no models: which precision a runnable model has is
    # its node's to say (in the search it serves and on every answer's header).
    def stated(name: str) -> dict:
        properties = model_object(node.catalog.get(name), published_precision)["properties"]
        return {p["property_id"]: p["value"] for p in properties}

    for name in (SMOL, SMOL_INT8, MINILM):
        assert "weight_precision" not in stated(name)
    assert stated(SMOL_INT8)["weight_codec"] == "int8"
    assert stated("@cf/meta/llama-3.1-8b-instruct")["weight_precision"] == "bfloat16"


@pytest.mark.parametrize(("params", "wanted"), [
    ({"task": "Text Embeddings"}, lambda spec: spec.task == "text-embeddings"),
    ({"task": "text-embeddings"}, lambda spec: spec.task == "text-embeddings"),
    ({"author": "sentence-transformers"}, lambda spec: spec.id.startswith("@cf/sentence-")),
    ({"search": "MiniLM"}, lambda spec: "minilm" in f"{spec.id} {spec.description}".lower()),
])
def test_models_search_filters(client, node, params, wanted):
    body = client.get(f"{API}/models/search", params=params).json()
    names = [m["name"] for m in body["result"]]
    assert MINILM in names and names == [s.id for s in node.catalog.specs if wanted(s)]


def test_models_search_pages(client, node):
    total = len(node.catalog.specs)
    body = client.get(f"{API}/models/search", params={"page": 2, "per_page": 1}).json()
    assert body["result"][0]["name"] == node.catalog.specs[1].id
    assert body["result_info"] == {"page": 2, "per_page": 1, "count": 1, "total_count": total}
    _error(client.get(f"{API}/models/search", params={"per_page": 0}), 400, 5006)


def test_models_schema(client):
    result = client.get(f"{API}/models/schema", params={"model": SMOL}).json()["result"]
    variants = {v["title"]: v for v in result["input"]["oneOf"]}
    assert variants["Prompt"]["required"] == ["prompt"]
    assert variants["Messages"]["properties"]["max_tokens"]["default"] == 256
    embeddings = client.get(f"{API}/models/schema", params={"model": MINILM}).json()["result"]
    assert embeddings["input"]["properties"]["text"]["oneOf"][1]["maxItems"] == 100
    assert "data" in embeddings["output"]["properties"]
    _error(client.get(f"{API}/models/schema", params={"model": "@cf/acme/nope"}), 400, 5007)
    _error(client.get(f"{API}/models/schema"), 400, 5006)


def test_schema_bounds_stop_strings_as_the_server_does(client):
    # The node refuses more than 4 stop strings or one over 256 characters (5006, `stop`);
    # its published schema says the same.
    result = client.get(f"{API}/models/schema", params={"model": SMOL}).json()["result"]
    schema = jsonschema_rs.validator_for(result["input"])
    base = {"prompt": "hi"}
    assert schema.is_valid(base | {"stop": ["x" * MAX_STOP_CHARS] * MAX_STOP_STRINGS})
    assert schema.is_valid(base | {"stop": "x" * MAX_STOP_CHARS})
    for stop in (["a"] * (MAX_STOP_STRINGS + 1), ["x" * (MAX_STOP_CHARS + 1)],
                 "x" * (MAX_STOP_CHARS + 1)):
        assert not schema.is_valid(base | {"stop": stop})


def test_openai_model_list_has_runnable_models(client, node):
    body = client.get(f"{API}/v1/models").json()
    assert body["object"] == "list"
    assert {m["id"] for m in body["data"]} == {s.id for s in node.catalog.specs if s.runnable}
    assert {m["owned_by"] for m in body["data"]} >= {"huggingfacetb"}


def test_without_a_secret_the_prefix_cache_salt_is_keyed_per_process(node):
    # Regression: the salt was the bare account id, so on a node that takes any account id
    # (no secret) anyone could name another tenant's account and probe its prefix cache.
    assert not node.settings.node_secret
    first, second = (TextGenerator(node, ServerMetrics(node)) for _ in range(2))
    salt = first.prefix_cache_salt("acct")
    assert salt == first.prefix_cache_salt("acct") != first.prefix_cache_salt("other")
    assert b"acct" not in salt and len(salt) == 32
    assert salt != second.prefix_cache_salt("acct")  # a key of its own: nobody can compute it
