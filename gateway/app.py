"""The gateway's HTTP app: the node's Workers AI and OpenAI routes for many accounts, the AI
Gateway URL forms, gateway and log administration, and the nodes' heartbeat endpoint.

  POST /client/v4/accounts/{acct}/ai/run/{model}           Workers AI REST (token required)
  POST /client/v4/accounts/{acct}/ai/v1/chat/completions    OpenAI-compatible; also embeddings
  GET  /client/v4/accounts/{acct}/ai/v1/models, …/ai/models/search, …/ai/models/schema
  POST /v1/{acct}/{gateway}                                 universal endpoint (array of steps)
  POST /v1/{acct}/{gateway}/compat/chat/completions         model "{provider}/{model}"
  POST /v1/{acct}/{gateway}/{provider}/{path}               e.g. workers-ai/@cf/…, workers-ai/v1/…
  GET|POST /client/v4/accounts/{acct}/ai-gateway/gateways  (GET|PUT|DELETE …/{gateway})
  GET|DELETE …/gateways/{gateway}/logs, GET …/logs/{id}
  POST /internal/nodes/heartbeat, GET /internal/nodes, GET /health
  GET /client/v4/accounts/{acct}/ai/fleet, …/ai/metrics/history, GET /metrics (routes_observe)
  GET /openapi.json                               this list as OpenAPI (edgefire.gateway.openapi)
  POST /run, /ai-gateway/run; GET /ai-api/models/search, …  a Worker's env.AI (routes_binding)
  GET / and /dashboard/…                          the dashboard (edgefire.gateway.dashboard)
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from edgefire.contract.errors import EdgefireError
from edgefire.contract.http_errors import InternalErrorMiddleware, handle_error
from edgefire.contract.node_report import HEARTBEAT_PATH
from edgefire.contract.openapi import OPENAPI_PATH, serve_document
from edgefire.gateway.batches import BatchWorker
from edgefire.gateway.binding_call import BINDING_PATHS, MF_URL
from edgefire.gateway.dashboard.routes import DashboardRoutes
from edgefire.gateway.metrics_history import MetricsHistory
from edgefire.gateway.openapi import ACCOUNT, GATEWAY, gateway_document
from edgefire.gateway.recording import recording_middleware
from edgefire.gateway.routes_admin import AdminRoutes
from edgefire.gateway.routes_binding import BindingRoutes
from edgefire.gateway.routes_inference import InferenceRoutes
from edgefire.gateway.routes_observe import ObserveRoutes
from edgefire.gateway.state import GatewayState


def create_app(state: GatewayState) -> Starlette:
    infer, admin = InferenceRoutes(state), AdminRoutes(state)
    binding = BindingRoutes(state, infer)
    history = MetricsHistory(state.metrics)
    observe, dashboard = ObserveRoutes(state, history), DashboardRoutes(state)

    async def root(request: Request) -> Response:
        """`/` is the dashboard's page, and where Miniflare sends a wrapped env.AI call (and
        its websocket probe, `?MF-Binding=AI` with an Upgrade)."""
        if (request.method == "POST" or MF_URL in request.headers
                or "upgrade" in request.headers or "MF-Binding" in request.query_params):
            return await binding.handle(request)
        return await dashboard.page(request)

    gateways = f"{ACCOUNT}/ai-gateway/gateways"
    routes = [
        Route(f"{ACCOUNT}/ai/run/{{model:path}}", infer.run, methods=["POST"]),
        Route(f"{ACCOUNT}/ai/v1/chat/completions", infer.openai, methods=["POST"]),
        Route(f"{ACCOUNT}/ai/v1/embeddings", infer.openai, methods=["POST"]),
        Route(f"{ACCOUNT}/ai/v1/models", infer.models, methods=["GET"]),
        Route(f"{ACCOUNT}/ai/models/search", infer.search, methods=["GET"]),
        Route(f"{ACCOUNT}/ai/models/schema", infer.schema, methods=["GET"]),
        Route(f"{ACCOUNT}/ai/fleet", observe.fleet, methods=["GET"]),
        Route(f"{ACCOUNT}/ai/metrics/history", observe.metrics_history, methods=["GET"]),
        Route("/metrics", observe.prometheus, methods=["GET"]),
        Route(GATEWAY, infer.universal, methods=["POST"]),
        Route(f"{GATEWAY}/compat/chat/completions", infer.compat, methods=["POST"]),
        Route(f"{GATEWAY}/{{provider}}/{{path:path}}", infer.provider, methods=["POST"]),
        Route(gateways, admin.list_gateways, methods=["GET"]),
        Route(gateways, admin.create_gateway, methods=["POST"]),
        Route(f"{gateways}/{{gateway_id}}", admin.get_gateway, methods=["GET"]),
        Route(f"{gateways}/{{gateway_id}}", admin.update_gateway, methods=["PUT"]),
        Route(f"{gateways}/{{gateway_id}}", admin.delete_gateway, methods=["DELETE"]),
        Route(f"{gateways}/{{gateway_id}}/logs", admin.list_logs, methods=["GET"]),
        Route(f"{gateways}/{{gateway_id}}/logs", admin.delete_logs, methods=["DELETE"]),
        Route(f"{gateways}/{{gateway_id}}/logs/{{log_id}}", admin.get_log, methods=["GET"]),
        Route(f"{gateways}/{{gateway_id}}/logs/{{log_id}}/request", admin.get_log_request,
              methods=["GET"]),
        Route(f"{gateways}/{{gateway_id}}/logs/{{log_id}}/response", admin.get_log_response,
              methods=["GET"]),
        Route(HEARTBEAT_PATH, admin.heartbeat, methods=["POST"]),
        Route("/internal/nodes", admin.nodes, methods=["GET"]),
        Route("/health", admin.health, methods=["GET"]),
        Route(OPENAPI_PATH, serve_document(gateway_document(state.catalog)), methods=["GET"]),
        # A Worker's env.AI speaks workerd's binding protocol, not the REST API (no account in
        # the path, bare results); it checks each call's method itself.
        *(Route(path, binding.handle, methods=["GET", "POST"])
          for path in BINDING_PATHS if path != "/"),
        Route("/", root, methods=["GET", "POST"]),
        *dashboard.routes(),
    ]

    worker = BatchWorker(state.batches, infer.run_batch_item, state.interactive_waiting)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        worker.start()
        history.start()
        try:
            yield
        finally:
            await history.stop()
            await worker.stop()
            await state.close()

    handlers = {EdgefireError: handle_error, HTTPException: handle_error}
    # Record/replay sits outermost: it sees the answer as sent, errors rendered by any layer.
    middleware = [*recording_middleware(state.settings, state.auth),
                  Middleware(InternalErrorMiddleware)]
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers,
                     middleware=middleware)
