"""OpenAPI 3.1 documents (`GET /openapi.json`) built from the schemas requests are checked
against (edgefire.contract.schemas), so the document cannot drift from what is enforced.

The node's document is here, with the pieces the gateway's (edgefire.gateway.openapi) shares: the
error bodies, the Workers AI routes of one account, and the endpoint that serves a document.
Each model's run route is a path of its own, as Cloudflare documents them, so its body is
its task's input schema.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edgefire.contract.catalog import Catalog
from edgefire.contract.schemas import (
    CHAT_COMPLETIONS_REQUEST,
    EMBEDDINGS_REQUEST,
    TEXT_EMBEDDINGS,
    TEXT_EMBEDDINGS_INPUT,
    TEXT_GENERATION,
    TEXT_GENERATION_INPUT,
)
from edgefire.contract.tasks import TASKS

OPENAPI_PATH = "/openapi.json"
_ANY_OBJECT = {"type": "object"}

ENVELOPE_ERROR = {
    "type": "object", "required": ["result", "success", "errors", "messages"],
    "properties": {
        "result": {"type": "null"}, "success": {"const": False},
        "errors": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["code", "message"],
            "properties": {"code": {"type": "integer"}, "message": {"type": "string"}}}},
        "messages": {"type": "array"},
    },
}

OPENAI_ERROR = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": "string"}}}},
}

# A runnable model's run route gets its task's schemas; other tasks are not served.
_SERVED_TASKS = {task_id: task for task_id, task in TASKS.items() if task.input_schema}


def envelope(result: dict) -> dict:
    """Cloudflare's v4 success envelope around result."""
    return {"type": "object", "required": ["result", "success", "errors", "messages"],
            "properties": {"result": result, "success": {"const": True},
                           "errors": {"type": "array"}, "messages": {"type": "array"}}}


def json_content(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


def operation(op_id: str, summary: str, *, ok: dict | None = None, body: dict | None = None,
              openai: bool = False, parameters: Iterable[dict] = (),
              security: list[dict] | None = None, ok_content: dict | None = None) -> dict:
    """One operation; its 4xx (and 5xx) answers are the Cloudflare envelope or, on the OpenAI
    routes, an OpenAI error body."""
    error = {"description": "error", "content": json_content(
        OPENAI_ERROR if openai else ENVELOPE_ERROR)}
    content = ok_content if ok_content is not None else json_content(ok or _ANY_OBJECT)
    found = {"operationId": op_id, "summary": summary,
             "responses": {"200": {"description": "success", "content": content},
                           "4XX": error, "5XX": error}}
    if body is not None:
        found["requestBody"] = {"required": True, "content": json_content(body)}
    if parameters:
        found["parameters"] = list(parameters)
    if security is not None:
        found["security"] = security
    return found


def parameter(name: str, where: str, schema: dict | None = None, *,
              required: bool = False, description: str = "") -> dict:
    found = {"name": name, "in": where, "required": required or where == "path",
             "schema": schema or {"type": "string"}}
    return found | ({"description": description} if description else {})


def document(title: str, description: str, paths: dict, security_schemes: dict) -> dict:
    return {"openapi": "3.1.0",
            "info": {"title": title, "version": "1", "description": description},
            "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
            "paths": paths, "components": {"securitySchemes": security_schemes}}


def workers_ai_paths(catalog: Catalog, prefix: str, security: list[dict],
                     headers: Iterable[dict] = ()) -> dict:
    """The Workers AI REST and OpenAI routes of one account under prefix (`…/{account_id}/ai`);
    headers: optional request headers every inference operation takes."""
    account = [parameter("account_id", "path")]
    inference = [*account, *headers]

    def op(op_id: str, summary: str, **kwargs) -> dict:
        return operation(op_id, summary, security=security, **kwargs)

    chat, embeddings = _openai_examples(catalog)
    paths = {f"{prefix}/run/{{model}}": {"post": op(
        "run", "Run any model by id: its task's inputs (see the model's own path)",
        body=_ANY_OBJECT, parameters=[*inference, parameter("model", "path")])}}
    for spec in catalog.specs:
        task = _SERVED_TASKS.get(spec.task)
        if spec.runnable and spec.weights and task is not None:
            paths[f"{prefix}/run/{spec.id}"] = {"post": op(
                f"run-{spec.id}", f"{task.name}: {spec.id}", body=task.input_schema,
                parameters=inference, ok_content=_run_output(task.output_schema))}
    paths |= {
        f"{prefix}/models/search": {"get": op(
            "models-search", "Search the catalog", ok=envelope({"type": "array"}),
            parameters=[*account, *_SEARCH_PARAMETERS])},
        f"{prefix}/models/schema": {"get": op(
            "models-schema", "A model's input and output JSON Schemas", ok=envelope(_ANY_OBJECT),
            parameters=[*account, parameter("model", "query", required=True)])},
        f"{prefix}/v1/chat/completions": {"post": op(
            "chat-completions", "OpenAI chat completions", body=chat,
            openai=True, parameters=inference,
            ok_content=json_content(_ANY_OBJECT) | {"text/event-stream": {"schema": {
                "type": "string"}}})},
        f"{prefix}/v1/embeddings": {"post": op(
            "embeddings", "OpenAI embeddings", body=embeddings, openai=True,
            parameters=inference)},
        f"{prefix}/v1/models": {"get": op(
            "models", "OpenAI model list (runnable models)", openai=True, parameters=account)},
    }
    return paths


def node_document(catalog: Catalog) -> dict:
    security = [{"nodeSecret": []}, {}]  # the secret is needed only where one is set
    paths = workers_ai_paths(catalog, "/client/v4/accounts/{account_id}/ai", security)
    paths |= {
        "/health": {"get": operation("health", "503 until the node is ready")},
        "/metrics": {"get": operation("metrics", "Prometheus metrics", ok_content={
            "text/plain": {"schema": {"type": "string"}}})},
        OPENAPI_PATH: {"get": operation("openapi", "This document")},
    }
    schemes = {"nodeSecret": {"type": "apiKey", "in": "header",
                              "name": "x-edgefire-node-secret"}}
    return document("edgefire edge node", "Workers AI and OpenAI-compatible inference on one "
                    "edge node.", paths, schemes)


def serve_document(built: dict):
    """A route endpoint answering with `built`."""
    async def endpoint(request: Request) -> Response:
        return JSONResponse(built)
    return endpoint


_SEARCH_PARAMETERS = (
    parameter("page", "query", {"type": "integer", "minimum": 1}),
    parameter("per_page", "query", {"type": "integer", "minimum": 1}),
    parameter("task", "query", description="a task id or name, e.g. Text Generation"),
    parameter("search", "query", description="words in the model id or description"),
    parameter("author", "query", description="e.g. meta"),
)


def _run_output(output: dict) -> dict:
    """A task's output schema as response content, per media type."""
    variants = output.get("oneOf", [output])
    return {v.get("contentType", "application/json"): {
        "schema": envelope(v) if v.get("contentType", "application/json") == "application/json"
        else v} for v in variants}


def _openai_examples(catalog: Catalog) -> tuple[dict, dict]:
    """The OpenAI body schemas with an example each: the task's, naming a model that runs."""
    runnable = [spec for spec in catalog.specs if spec.runnable and spec.weights]
    found = []
    for schema, task, example in (
            (CHAT_COMPLETIONS_REQUEST, TEXT_GENERATION, TEXT_GENERATION_INPUT["examples"][-1]),
            (EMBEDDINGS_REQUEST, TEXT_EMBEDDINGS,
             {"input": TEXT_EMBEDDINGS_INPUT["examples"][0]["text"]})):
        model = next((spec.id for spec in runnable if spec.task == task), None)
        found.append(schema if model is None else {**schema, "examples": [
            {"model": model, **example}]})
    return found[0], found[1]
