"""Fuzzing both apps from their own OpenAPI documents (schemathesis), over real HTTP.

Every operation gets valid and invalid inputs drawn from the schemas its route checks; every
answer must come in time, never be a 5xx, and a 4xx must be the Cloudflare envelope (an OpenAI
error body on the OpenAI routes). Without real models (a gateway with no node, a node with no
room for a model) the fuzzing is thorough and fast: schemathesis' coverage phase too. With
SmolLM2 and MiniLM it samples. Examples are derandomized, so a run is repeatable; raise the
counts locally to explore further.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig

from edgefire.contract.catalog import Catalog
from edgefire.contract.cities import load_city
from edgefire.contract.headers import NODE_SECRET
from edgefire.contract.http_errors import is_openai_path
from edgefire.contract.node_report import HEARTBEAT_PATH
from edgefire.contract.openapi import node_document
from edgefire.gateway.app import create_app as create_gateway_app
from edgefire.gateway.db import Database
from edgefire.gateway.openapi import gateway_document
from edgefire.gateway.settings import GatewaySettings
from edgefire.gateway.state import GatewayState
from edgefire.runtime.node.heartbeat import HeartbeatSender
from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.node.settings import NodeSettings
from edgefire.runtime.server.app import create_app as create_node_app

SECRET = "fuzz-secret"
ACCOUNT = "f0" * 16  # fixed, so the gateway's schema can pin its paths to the account
GATEWAY = "fuzz"  # the gateway the AI Gateway and admin paths are pinned to
# Generous: a CPU model shares two cores with the rest of the suite. A hang still fails.
TIMEOUT_S = 60.0
# Where real models answer, generations stay short: a KV pool of ~180 tokens makes a longer
# one 3010 at once (streamed or not), and the request timeout ends slow ones as 3007.
KV_CACHE_MIB = 4
REQUEST_TIMEOUT_S = 2.0
# The quantized variants would each load another model, for no route of their own.
OTHER_VARIANTS = r"-(int8|int4|unweight)$"
SMOL = "@cf/huggingfacetb/smollm2-135m-instruct"
MINILM = "@cf/sentence-transformers/all-minilm-l6-v2"
SERVED = {"/v1/chat/completions": SMOL, "/v1/embeddings": MINILM,
          "/compat/chat/completions": f"workers-ai/{SMOL}"}

_THOROUGH = settings(max_examples=50, deadline=None, derandomize=True, database=None,
                     suppress_health_check=list(HealthCheck))
_SAMPLED = settings(_THOROUGH, max_examples=30)
_CATALOG = Catalog.load(None)


@schemathesis.check
def error_envelope(ctx, response, case) -> None:
    """A 4xx body is Cloudflare's error envelope, or an OpenAI error on the OpenAI routes."""
    if not 400 <= response.status_code < 500:
        return
    body = response.json()
    if is_openai_path(response.request.url):
        error = body["error"]
        assert isinstance(error["message"], str) and isinstance(error["type"], str), body
        assert error["code"].isdigit() and "param" in error, body
        return
    assert body["success"] is False and body["result"] is None, body
    assert body["messages"] == [] and body["errors"], body
    for error in body["errors"]:
        assert isinstance(error["code"], int) and isinstance(error["message"], str), body


def _schema(document: dict, *, coverage: bool, **parameters: str):
    """The document as schemathesis reads it; parameters pin path parameters to a value."""
    config = SchemathesisConfig.from_dict({
        "parameters": parameters, "request-timeout": TIMEOUT_S,
        "phases": {"coverage": {"enabled": coverage}, "stateful": {"enabled": False}},
    })
    return schemathesis.openapi.from_dict(document, config=config)


def _gateway_schema(*, coverage: bool):
    return _schema(gateway_document(_CATALOG), coverage=coverage, account_id=ACCOUNT,
                   gateway_id=GATEWAY, provider="workers-ai")


def _name_a_served_model(case) -> None:
    """The fuzzer cannot guess a model id: half the bodies naming one get one that runs."""
    body = case.body
    if not (isinstance(body, dict) and isinstance(body.get("model"), str)):
        return
    for route, model in SERVED.items():
        if case.path.endswith(route) and len(body["model"]) % 2 == 0:
            body["model"] = model


@dataclass(slots=True)
class Target:
    base_url: str
    headers: dict[str, str]  # sent with every fuzzed call
    gateway: GatewayState | None = None

    def call(self, case) -> None:
        if self.gateway is not None and self.gateway.gateways.get(ACCOUNT, GATEWAY) is None:
            self.gateway.gateways.create(ACCOUNT, {"id": GATEWAY})  # a fuzzed DELETE took it
        _name_a_served_model(case)
        case.call_and_validate(base_url=self.base_url, headers=self.headers,
                               checks=[not_a_server_error, error_envelope])


@contextlib.contextmanager
def _gateway(serve) -> Iterator[Target]:
    """A gateway over HTTP with one account, whose token every call carries."""
    settings = GatewaySettings(node_secret=SECRET, heartbeat_timeout_s=3600)
    state = GatewayState.build(settings, db=Database(":memory:"))
    state.accounts.create_account("fuzz", account_id=ACCOUNT)
    _, token = state.accounts.create_token(ACCOUNT)
    with serve(create_gateway_app(state)) as base_url:
        yield Target(base_url, {"authorization": f"Bearer {token}", NODE_SECRET: SECRET},
                     state)


@contextlib.contextmanager
def _node(serve, memory_budget_gib: float | None = None) -> Iterator[tuple[EdgeNode, Target]]:
    city = load_city("fra")
    if memory_budget_gib is not None:
        city = dataclasses.replace(city, memory_budget_gib=memory_budget_gib)
    settings = NodeSettings(node_secret=SECRET, kv_cache_mib=KV_CACHE_MIB)
    node = EdgeNode(city, settings)
    with serve(create_node_app(node)) as base_url:
        yield node, Target(base_url, {NODE_SECRET: SECRET})


# -- no model runs: input handling, every route, thoroughly ----------------------------------

@pytest.fixture(scope="module")
def lone_gateway(serve):
    with _gateway(serve) as target:
        yield target


@pytest.fixture(scope="module")
def empty_node(serve):
    with _node(serve, memory_budget_gib=0.01) as (_, target):  # too small for any model: 3040
        yield target


@_gateway_schema(coverage=True).parametrize()
@_THOROUGH
def test_gateway_without_nodes_survives_fuzzing(case, lone_gateway):
    lone_gateway.call(case)


@_schema(node_document(_CATALOG), coverage=True).parametrize()
@_THOROUGH
def test_node_input_handling_survives_fuzzing(case, empty_node):
    empty_node.call(case)


# -- SmolLM2 and MiniLM, on a node alone and behind the gateway: sampled ---------------------

@pytest.fixture(scope="module")
def node(serve):
    with _node(serve) as (edge, target):
        # Loaded before the fuzzing, so no load runs into the short request timeout.
        for model, inputs in ((SMOL, {"prompt": "Hi", "max_tokens": 1}), (MINILM, {"text": "Hi"})):
            httpx.post(f"{target.base_url}/client/v4/accounts/{ACCOUNT}/ai/run/{model}",
                       json=inputs, headers=target.headers, timeout=600).raise_for_status()
        edge.settings.request_timeout_s = REQUEST_TIMEOUT_S  # read per request
        yield edge, target


@pytest.fixture(scope="module")
def fronted_gateway(serve, node):
    edge, node_target = node
    with _gateway(serve) as target:
        beat = HeartbeatSender(edge, target.base_url, node_target.base_url, 1.0, SECRET)
        httpx.post(f"{target.base_url}{HEARTBEAT_PATH}", json=beat.report().to_json(),
                   headers={NODE_SECRET: SECRET}).raise_for_status()
        yield target


@pytest.mark.slow
@_schema(node_document(_CATALOG), coverage=False).exclude(path_regex=OTHER_VARIANTS) \
    .parametrize()
@_SAMPLED
def test_node_survives_fuzzing(case, node):
    node[1].call(case)


# A fuzzed heartbeat would move the node's city elsewhere (the lone gateway fuzzes those).
@pytest.mark.slow
@_gateway_schema(coverage=False).exclude(path_regex=OTHER_VARIANTS).exclude(path=HEARTBEAT_PATH) \
    .parametrize()
@_SAMPLED
def test_gateway_with_a_node_survives_fuzzing(case, fronted_gateway):
    fronted_gateway.call(case)
