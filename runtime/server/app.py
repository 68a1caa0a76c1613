"""The node's HTTP app: Workers AI REST, its OpenAI-compatible routes, catalog, health, metrics.

Routes (under API = /client/v4/accounts/{account_id}/ai, guarded by the node secret):
  POST API/run/{model}             Workers AI run: the model's task inputs, CF envelope
  GET  API/models/search           catalog search, CF envelope with result_info
  GET  API/models/schema?model=    the model's input/output JSON Schema
  POST API/v1/chat/completions     OpenAI chat completions (bare OpenAI bodies and errors)
  POST API/v1/embeddings           OpenAI embeddings
  GET  API/v1/models               OpenAI model list (runnable models)
  POST /internal/kv/prefill        a decode node's prefill hand-off (runtime/server/prefill.py;
                                   node secret)
  GET  /health                     503 until the node is ready, then node.health(): 200 with
                                   status "ok", or "degraded" while a model failed lately (the
                                   node stays routable: its other models serve, and a dead
                                   engine is rebuilt by the next request for its model)
  GET  /metrics                    Prometheus text (names in edgefire.runtime.server.metrics)
  GET  /openapi.json               this list as OpenAPI (edgefire.contract.openapi)
Health, metrics and the document need no secret: load balancers and scrapers probe them.
Every inference response names the model's weight precision in x-edgefire-weight-precision.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from functools import partial

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.routing import Mount, Route

from edgefire.contract.catalog_api import CatalogRoutes
from edgefire.contract.errors import EdgefireError
from edgefire.contract.http_errors import InternalErrorMiddleware, handle_error
from edgefire.contract.openapi import OPENAPI_PATH, node_document, serve_document
from edgefire.runtime.node.heartbeat import HeartbeatSender
from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.server.auth import NodeSecretMiddleware
from edgefire.runtime.server.embedding import Embedder
from edgefire.runtime.server.generation import TextGenerator
from edgefire.runtime.server.metrics import ServerMetrics
from edgefire.runtime.server.native import WorkersAIRoutes
from edgefire.runtime.server.openai_compat import OpenAIRoutes
from edgefire.runtime.server.ops import OpsRoutes
from edgefire.runtime.server.prefill import INTERNAL_PREFIX, PREFILL_ROUTE, PrefillRoutes
from edgefire.runtime.weight_precision import compute_precision, stated_precision

API_PREFIX = "/client/v4/accounts/{account_id}/ai"


def create_app(node: EdgeNode) -> Starlette:
    metrics = ServerMetrics(node)
    text, embedder = TextGenerator(node, metrics), Embedder(node, metrics)
    native = WorkersAIRoutes(node, text, embedder)
    openai = OpenAIRoutes(node, text, embedder)
    compute = compute_precision(node.settings.dtype)
    catalog = CatalogRoutes(node.catalog, partial(stated_precision, compute=compute))
    ops = OpsRoutes(node, metrics)
    prefill = PrefillRoutes(node)
    api = [
        Route("/run/{model:path}", native.run, methods=["POST"]),
        Route("/models/search", catalog.search, methods=["GET"]),
        Route("/models/schema", catalog.schema, methods=["GET"]),
        Route("/v1/chat/completions", openai.chat_completions, methods=["POST"]),
        Route("/v1/embeddings", openai.embeddings, methods=["POST"]),
        Route("/v1/models", openai.models, methods=["GET"]),
    ]
    routes = [
        Mount(API_PREFIX, routes=api, middleware=[Middleware(NodeSecretMiddleware, node=node)]),
        Mount(INTERNAL_PREFIX, routes=[Route(PREFILL_ROUTE, prefill.prefill, methods=["POST"])],
              middleware=[Middleware(NodeSecretMiddleware, node=node)]),
        Route("/health", ops.health, methods=["GET"]),
        Route("/metrics", ops.prometheus, methods=["GET"]),
        Route(OPENAPI_PATH, serve_document(node_document(node.catalog)), methods=["GET"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        node.start()
        heartbeat = HeartbeatSender.from_node(node)
        if heartbeat is not None:
            heartbeat.start()
        try:
            yield
        finally:
            if heartbeat is not None:
                await asyncio.to_thread(heartbeat.stop)  # joins its thread: off the loop
            text.handoff.close()
            node.stop()

    handlers = {EdgefireError: handle_error, HTTPException: handle_error}
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers,
                     middleware=[Middleware(InternalErrorMiddleware)])
