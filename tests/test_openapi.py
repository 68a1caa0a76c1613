"""The OpenAPI documents and the schema checks behind them: one set of schemas, served and
enforced."""

from __future__ import annotations

import httpx
import pytest
import schemathesis

from edgefire.contract.cities import load_city
from edgefire.contract.errors import InvalidInputError
from edgefire.contract.openapi import node_document
from edgefire.contract.schemas import (
    CHAT_COMPLETIONS_REQUEST,
    HEARTBEAT,
    TEXT_EMBEDDINGS_INPUT,
    TEXT_GENERATION_INPUT,
)
from edgefire.contract.tasks import TASKS
from edgefire.contract.validation import Checker
from edgefire.gateway.app import create_app as create_gateway_app
from edgefire.gateway.db import Database
from edgefire.gateway.openapi import gateway_document
from edgefire.gateway.schemas import GATEWAY_CREATE
from edgefire.gateway.settings import GatewaySettings
from edgefire.gateway.state import GatewayState
from edgefire.runtime.node.heartbeat import HeartbeatSender
from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.node.settings import NodeSettings
from edgefire.runtime.server.app import create_app as create_node_app

SMOL = "@cf/huggingfacetb/smollm2-135m-instruct"
RUN = "/client/v4/accounts/{account_id}/ai/run"


@pytest.fixture(scope="module")
def node() -> EdgeNode:
    return EdgeNode(load_city("fra"), NodeSettings(node_secret="s3cret"))


def _body_schema(document: dict, path: str) -> dict:
    return document["paths"][path]["post"]["requestBody"]["content"]["application/json"][
        "schema"]


def test_both_apps_serve_their_document_without_credentials(serve, node):
    state = GatewayState.build(GatewaySettings(node_secret="s3cret"), db=Database(":memory:"))
    with serve(create_node_app(node)) as node_url, serve(create_gateway_app(state)) as gw_url:
        served_node = httpx.get(f"{node_url}/openapi.json")
        served_gateway = httpx.get(f"{gw_url}/openapi.json")
    assert served_node.status_code == served_gateway.status_code == 200
    assert served_node.json() == node_document(node.catalog)
    assert served_gateway.json() == gateway_document(state.catalog)


@pytest.mark.parametrize("build", [node_document, gateway_document])
def test_documents_load_as_openapi_3_1(node, build):
    schema = schemathesis.openapi.from_dict(build(node.catalog))
    operations = list(schema.get_all_operations())
    assert operations and all(op.ok() for op in operations)


def test_documented_bodies_are_the_checked_schemas(node):
    document = node_document(node.catalog)
    assert _body_schema(document, f"{RUN}/{SMOL}") is TEXT_GENERATION_INPUT
    assert TASKS["text-generation"].input_schema is TEXT_GENERATION_INPUT
    chat = _body_schema(document, "/client/v4/accounts/{account_id}/ai/v1/chat/completions")
    assert chat == {**CHAT_COMPLETIONS_REQUEST, "examples": chat["examples"]}
    runnable = {s.id for s in node.catalog.specs if s.runnable and s.weights}
    runs = {p.removeprefix(f"{RUN}/") for p in document["paths"] if p.startswith(f"{RUN}/@")}
    assert runs == runnable


def test_every_documented_example_passes_its_schema(node):
    for document in (node_document(node.catalog), gateway_document(node.catalog)):
        for path, operations in document["paths"].items():
            body = operations.get("post", {}).get("requestBody")
            schema = body and body["content"]["application/json"]["schema"]
            for example in (schema or {}).get("examples", []):
                assert Checker(schema).check(example) == example, path


def test_a_nodes_heartbeat_passes_the_schema_the_gateway_checks(node):
    payload = HeartbeatSender(node, "http://gateway", "http://node:1", 1.0, None).report().to_json()
    assert Checker(HEARTBEAT).check(payload) == payload


@pytest.mark.parametrize(("schema", "body", "field", "message"), [
    (TEXT_GENERATION_INPUT, {}, "messages", "messages or prompt is required"),
    (TEXT_GENERATION_INPUT, {"prompt": "a", "messages": [{"role": "user", "content": "x"}]},
     "prompt", "prompt cannot be given with messages"),
    # The variant the body names is the one its errors come from.
    (TEXT_GENERATION_INPUT, {"prompt": "a", "max_tokens": 0}, "max_tokens",
     "max_tokens must be >= 1"),
    (TEXT_GENERATION_INPUT,
     {"messages": [{"role": "user", "content": [{"type": "image", "text": "x"}]}]},
     "messages[0].content[0].type", "messages[0].content[0].type must be 'text'"),
    (TEXT_GENERATION_INPUT, {"messages": [{"role": "user"}]}, "messages[0].content",
     "messages[0].content is required"),
    # Of a string or an array, the form of the value's type.
    (TEXT_EMBEDDINGS_INPUT, {"text": ["ok", ""]}, "text[1]", "text[1] must not be empty"),
    (TEXT_EMBEDDINGS_INPUT, {"text": 3}, "text", "text must be a string or an array"),
    (TEXT_GENERATION_INPUT, {"prompt": "a", "stream": "yes"}, "stream",
     "stream must be a boolean"),
    (CHAT_COMPLETIONS_REQUEST, [], "body", "body must be an object"),
    (GATEWAY_CREATE, {"id": "Upper"}, "id",
     "id must be 1-64 characters of a-z, 0-9, '-' and '_'"),
    # A value is never echoed: it may be a megabyte.
    (TEXT_GENERATION_INPUT, {"prompt": "x" * 10_000, "seed": "y" * 10_000}, "seed",
     "seed must be an integer"),
])
def test_schema_errors_name_the_field(schema, body, field, message):
    with pytest.raises(InvalidInputError) as caught:
        Checker(schema).check(body)
    assert (caught.value.field, caught.value.message) == (field, message)


def test_null_counts_as_absent():
    body = {"prompt": "a", "max_tokens": None, "stop": None, "options": {"rejectIfBusy": None}}
    assert Checker(TEXT_GENERATION_INPUT).check(body) == body
