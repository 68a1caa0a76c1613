"""The gateway's OpenAPI document (`GET /openapi.json`), from the schemas its routes check:
the node's (edgefire.contract.schemas) for what it forwards, its own
(edgefire.gateway.schemas) for the rest.
"""

from __future__ import annotations

from edgefire.contract.bodies import MAX_PAGE
from edgefire.contract.catalog import Catalog
from edgefire.contract.node_report import HEARTBEAT_PATH
from edgefire.contract.openapi import (
    ENVELOPE_ERROR,
    OPENAI_ERROR,
    OPENAPI_PATH,
    document,
    envelope,
    json_content,
    operation,
    parameter,
    workers_ai_paths,
)
from edgefire.contract.schemas import CHAT_COMPLETIONS_REQUEST, HEARTBEAT
from edgefire.gateway.schemas import GATEWAY_CREATE, GATEWAY_SETTINGS, UNIVERSAL_STEPS

ACCOUNT = "/client/v4/accounts/{account_id}"  # the route prefixes edgefire.gateway.app serves
GATEWAY = "/v1/{account_id}/{gateway_id}"
# An account token as `Authorization: Bearer`, or as `cf-aig-authorization` (the only one an
# authenticated gateway takes).
_TOKEN = [{"bearer": []}, {"aigAuthorization": []}]

# Per-request AI Gateway settings (cache, logs, retries, cost), all optional.
_AIG_HEADERS = [parameter(name, "header", description=text) for name, text in (
    ("cf-aig-cache-ttl", "seconds; 0 turns caching off"),
    ("cf-aig-skip-cache", "true or false"),
    ("cf-aig-cache-key", "a custom cache key"),
    ("cf-aig-collect-log", "true or false"),
    ("cf-aig-metadata", "a JSON object of up to 5 scalar values"),
    ("cf-aig-custom-cost", "JSON: {total_cost} or {per_token_in, per_token_out}"),
    ("cf-aig-max-attempts", "1..5"),
    ("cf-aig-retry-delay", "milliseconds, 0..5000"),
    ("cf-aig-backoff", "constant, linear or exponential"),
    ("cf-aig-request-timeout", "milliseconds, 1..600000"),
    ("x-session-affinity", "keeps a conversation on the node holding its prefix cache"),
    ("x-edgefire-fault", "fail as production does: capacity, rate-limit, timeout, server-error "
     "or stream-cut, and/or latency=MS (EDGEFIRE_FAULT_INJECTION; refused when off)"),
)]
_OPENAI_OR_ENVELOPE = {"oneOf": [ENVELOPE_ERROR, OPENAI_ERROR]}


def gateway_document(catalog: Catalog) -> dict:
    rest = workers_ai_paths(catalog, f"{ACCOUNT}/ai", _TOKEN, [
        parameter("cf-aig-gateway-id", "header", description="run through this AI Gateway"),
        *_AIG_HEADERS])
    return document(
        "edgefire gateway",
        "Workers AI REST and AI Gateway for many accounts, in front of the edge nodes.",
        rest | _ai_gateway_paths() | _admin_paths() | _fleet_paths(),
        {"bearer": {"type": "http", "scheme": "bearer"},
         "aigAuthorization": {"type": "apiKey", "in": "header", "name": "cf-aig-authorization",
                              "description": "Bearer <token>"},
         "nodeSecret": {"type": "apiKey", "in": "header", "name": "x-edgefire-node-secret"}})


def _ai_gateway_paths() -> dict:
    where = [parameter("account_id", "path"), parameter("gateway_id", "path"), *_AIG_HEADERS]
    compat = {**CHAT_COMPLETIONS_REQUEST, "properties": {
        **CHAT_COMPLETIONS_REQUEST["properties"],
        "model": {"type": "string", "description": "{provider}/{model}, e.g. "
                                                   "workers-ai/@cf/meta/llama-3.1-8b"}}}
    provider = operation(
        "provider", "A provider's own API path, e.g. workers-ai/@cf/… or workers-ai/v1/…",
        body={}, security=_TOKEN,
        parameters=[*where, parameter("provider", "path"), parameter("path", "path")])
    for status in ("4XX", "5XX"):  # OpenAI errors on OpenAI paths, Cloudflare's elsewhere
        provider["responses"][status]["content"] = json_content(_OPENAI_OR_ENVELOPE)
    return {
        GATEWAY: {"post": operation("universal", "Steps tried in order (fallbacks)",
                                    body=UNIVERSAL_STEPS, security=_TOKEN, parameters=where)},
        f"{GATEWAY}/compat/chat/completions": {"post": operation(
            "compat-chat-completions", "OpenAI chat completions for any provider's model",
            body=compat, openai=True, security=_TOKEN, parameters=where)},
        f"{GATEWAY}/{{provider}}/{{path}}": {"post": provider},
    }


def _admin_paths() -> dict:
    gateways = f"{ACCOUNT}/ai-gateway/gateways"
    account = [parameter("account_id", "path")]
    one = [*account, parameter("gateway_id", "path")]
    filters = [parameter(name, "query", {"enum": ["true", "false"]})
               for name in ("success", "cached")]
    filters += [parameter(name, "query") for name in ("provider", "model")]
    filters.append(parameter("metadata", "query", description="a JSON object of scalar values "
                                                              "every matching log's metadata has"))
    page = [parameter(name, "query", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE})
            for name in ("page", "per_page")]
    order = parameter("order_by_direction", "query", {"enum": ["asc", "desc"]})
    gateway = envelope({"type": "object"})

    def op(op_id: str, summary: str, **kwargs) -> dict:
        return operation(op_id, summary, security=_TOKEN, **kwargs)

    return {
        gateways: {
            "get": op("gateways-list", "The account's gateways",
                      ok=envelope({"type": "array"}), parameters=account),
            "post": op("gateways-create", "Create a gateway", body=GATEWAY_CREATE, ok=gateway,
                       parameters=account)},
        f"{gateways}/{{gateway_id}}": {
            "get": op("gateways-get", "A gateway", ok=gateway, parameters=one),
            "put": op("gateways-update", "Change a gateway's settings", body=GATEWAY_SETTINGS,
                      ok=gateway, parameters=one),
            "delete": op("gateways-delete", "Delete a gateway and its logs", parameters=one)},
        f"{gateways}/{{gateway_id}}/logs": {
            "get": op("logs-list", "A page of the gateway's logs",
                      parameters=[*one, *page, order, *filters]),
            "delete": op("logs-delete", "Delete the logs matching every filter",
                         parameters=[*one, *filters])},
        f"{gateways}/{{gateway_id}}/logs/{{log_id}}": {
            "get": op("logs-get", "One log", parameters=[*one, parameter("log_id", "path")])},
        f"{gateways}/{{gateway_id}}/logs/{{log_id}}/request": {
            "get": op("logs-request", "The request body a log kept",
                      parameters=[*one, parameter("log_id", "path")])},
        f"{gateways}/{{gateway_id}}/logs/{{log_id}}/response": {
            "get": op("logs-response", "The response body a log kept",
                      parameters=[*one, parameter("log_id", "path")])},
        f"{ACCOUNT}/ai/fleet": {
            "get": op("fleet", "Every city: health, load, loaded models, which models it may "
                      "host", ok=envelope({"type": "object"}), parameters=account)},
        f"{ACCOUNT}/ai/metrics/history": {
            "get": op("metrics-history", "The account's request, token, latency, cache and "
                      "error series over the last minutes", ok=envelope({"type": "object"}),
                      parameters=[*account, parameter(
                          "window_s", "query", {"type": "integer", "minimum": 10,
                                                "maximum": 600})])},
    }


def _fleet_paths() -> dict:
    return {
        HEARTBEAT_PATH: {"post": operation(
            "heartbeat", "A node reports itself", body=HEARTBEAT,
            security=[{"nodeSecret": []}, {}])},
        "/internal/nodes": {"get": operation("nodes", "The node directory")},
        "/metrics": {"get": operation("metrics", "Prometheus metrics (admin token)")},
        "/health": {"get": operation("health", "The gateway and its healthy nodes")},
        OPENAPI_PATH: {"get": operation("openapi", "This document")},
    }
