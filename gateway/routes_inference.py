"""Inference routes: Workers AI REST and OpenAI routes, AI Gateway provider URLs, universal
endpoint and the unified compat endpoint. Each becomes a GatewayRequest for the pipeline."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edgefire.contract.bodies import parse_json, read_body
from edgefire.contract.catalog_api import CatalogRoutes, openai_model_list, published_precision
from edgefire.contract.disconnect import unless_disconnected
from edgefire.contract.envelope import success
from edgefire.contract.errors import EdgefireError, InvalidInputError, NotFoundError
from edgefire.contract.tasks import TASKS
from edgefire.contract.validation import Checker
from edgefire.gateway.batches import RetryLater
from edgefire.gateway.gateways import GatewayConfig
from edgefire.gateway.pipeline import GatewayRequest, Step
from edgefire.gateway.providers.base import UpstreamRequest
from edgefire.gateway.retries import RetryPolicy
from edgefire.gateway.schemas import UNIVERSAL_STEPS
from edgefire.gateway.state import GatewayState

WORKERS_AI = "workers-ai"
_NO_CAPACITY_NOW = (429, 503)  # a batch item meeting these waits in the queue
_MAX_POLL_BYTES = 256  # a poll is {"request_id": "<uuid>"}; anything longer is a model input
_STEPS = Checker(UNIVERSAL_STEPS)


class InferenceRoutes:
    def __init__(self, state: GatewayState) -> None:
        self.state = state
        # No compute dtype: the nodes choose theirs, so a dense model's precision is left to
        # them (each response names it in x-edgefire-weight-precision).
        self.catalog = CatalogRoutes(state.catalog, published_precision)

    # Workers AI REST (`/client/v4/accounts/{acct}/ai/…`); cf-aig-gateway-id opts into a gateway.
    async def run(self, request: Request) -> Response:
        account_id = self._account(request)  # before reading a body of up to max_batch_bytes
        queued = request.query_params.get("queueRequest", "").lower() == "true"
        settings = self.state.settings
        body = await read_body(request, settings.max_batch_bytes if queued
                               else settings.max_request_bytes)
        batch = await self._batch(request, account_id, body, queued)
        if batch is not None:
            return batch
        return await self._workers_ai(request, request.path_params["model"], "Workers AI REST",
                                      account_id, body)

    async def _batch(self, request: Request, account_id: str, body: bytes,
                     queued: bool) -> Response | None:
        """Async batch (gateway/batches.py): `?queueRequest=true` with `{requests}` queues,
        `{request_id}` (with or without the query) polls; None for an interactive call."""
        if not queued and len(body) > _MAX_POLL_BYTES:
            return None
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        if not queued and not (isinstance(data, dict) and set(data) == {"request_id"}):
            return None
        if not isinstance(data, dict):
            raise InvalidInputError("the request body must be a JSON object", field="body")
        batches = self.state.batches
        if "request_id" in data:
            return success(await asyncio.to_thread(batches.poll, account_id,
                                                   data["request_id"]))
        model = self.state.catalog.find(request.path_params["model"], TASKS).id
        return success(await asyncio.to_thread(batches.enqueue, account_id, model, data))

    async def run_batch_item(self, account_id: str, model: str,
                             inputs: dict) -> tuple[bool, object]:
        """One queued item through the pipeline, as a plain Workers AI call."""
        body = json.dumps(inputs).encode()
        upstream = UpstreamRequest(account_id, model, body, stream=False)
        step = Step.of(WORKERS_AI, upstream, model, RetryPolicy(), {})
        call = GatewayRequest(account_id, None, f"/ai/run/{model}", "Workers AI Batch", [step])
        try:
            response = await self.state.pipeline.handle(call)
        except EdgefireError as exc:
            if exc.status in _NO_CAPACITY_NOW:
                raise RetryLater from exc
            return False, [{"code": exc.code, "message": exc.message}]
        if response.status_code in _NO_CAPACITY_NOW:
            raise RetryLater
        answer = json.loads(response.body)
        if answer.get("success"):
            return True, answer["result"]
        return False, answer.get("errors") or [{"code": 3001, "message": "no answer"}]

    async def openai(self, request: Request) -> Response:
        path = "v1/" + request.url.path.rsplit("/v1/", 1)[1]
        return await self._workers_ai(request, path, "Workers AI OpenAI")

    async def models(self, request: Request) -> Response:
        self._account(request)
        return JSONResponse(openai_model_list(self.state.catalog))

    async def search(self, request: Request) -> Response:
        self._account(request)
        return await self.catalog.search(request)

    async def schema(self, request: Request) -> Response:
        self._account(request)
        return await self.catalog.schema(request)

    async def _workers_ai(self, request: Request, path: str, request_type: str,
                          account_id: str | None = None, body: bytes | None = None) -> Response:
        account_id = account_id or self._account(request)
        gateway_id = request.headers.get("cf-aig-gateway-id")
        gateway = self._authorized(request, account_id, gateway_id) if gateway_id else None
        if body is None:
            body = await read_body(request, self.state.settings.max_request_bytes)
        step = self._step(request, account_id, WORKERS_AI, path, body, request.headers)
        return await self._handle(account_id, gateway, request, request_type, [step])

    async def binding_run(self, request: Request, account_id: str,
                          gateway: GatewayConfig | None, model: str, body: bytes,
                          headers: Mapping[str, str]) -> Response:
        """A Worker's `env.AI.run` (gateway/routes_binding.py): a Workers AI REST call whose
        account, gateway and cf-aig-* headers the binding route has already worked out."""
        step = self._step(request, account_id, WORKERS_AI, model, body, headers)
        call = GatewayRequest(account_id, gateway, f"/ai/run/{model}", "Workers AI Binding",
                              [step])
        return await unless_disconnected(request.receive, self.state.pipeline.handle(call))

    # AI Gateway (`/v1/{acct}/{gateway}/…`).
    async def provider(self, request: Request) -> Response:
        account_id, gateway = self._gateway_of(request)
        provider, path = request.path_params["provider"], request.path_params["path"]
        body = await read_body(request, self.state.settings.max_request_bytes)
        step = self._step(request, account_id, provider, path, body, request.headers)
        return await self._handle(account_id, gateway, request, "Provider", [step])

    async def compat(self, request: Request) -> Response:
        """`model: "{provider}/{model}"`: Workers AI models are `workers-ai/@cf/…`."""
        account_id, gateway = self._gateway_of(request)
        body = parse_json(await read_body(request, self.state.settings.max_request_bytes))
        provider, _, model = str(body.get("model", "")).partition("/")
        if not provider or not model:
            raise InvalidInputError('model must be "{provider}/{model}"', field="model")
        path = "v1/chat/completions" if provider == WORKERS_AI else "chat/completions"
        raw = json.dumps({**body, "model": model}).encode()
        step = self._step(request, account_id, provider, path, raw, request.headers)
        return await self._handle(account_id, gateway, request, "Compat", [step])

    async def universal(self, request: Request) -> Response:
        """A JSON array of steps, tried in order; `cf-aig-step` says which one answered."""
        account_id, gateway = self._gateway_of(request)
        raw = await read_body(request, self.state.settings.max_request_bytes)
        entries = _STEPS.check(parse_json(raw, list))
        steps = [self._universal_step(request, account_id, entry) for entry in entries]
        return await self._handle(account_id, gateway, request, "Universal", steps, True)

    def _universal_step(self, request: Request, account_id: str, entry: dict) -> Step:
        step_headers = {k.lower(): str(v) for k, v in (entry.get("headers") or {}).items()}
        headers = {**request.headers, **step_headers}  # step-level headers win
        body = json.dumps(entry.get("query", {})).encode()
        return self._step(request, account_id, entry["provider"], entry["endpoint"], body,
                          headers, entry.get("config"))

    def _step(self, request: Request, account_id: str, provider: str, path: str, body: bytes,
              headers: Mapping[str, str], config: dict | None = None) -> Step:
        stream, model = _stream_and_model(body)
        model = path if provider == WORKERS_AI and path.startswith("@") else model
        upstream = UpstreamRequest(
            account_id, path, body, stream=stream,
            session_id=request.headers.get("x-session-affinity"),
            location=self.state.locator.locate(request.headers,
                                               request.client.host if request.client else None))
        retry = RetryPolicy().overridden(headers, config)
        return Step.of(provider, upstream, model, retry, headers)

    async def _handle(self, account_id: str, gateway: GatewayConfig | None, request: Request,
                      request_type: str, steps: list[Step], universal: bool = False) -> Response:
        call = GatewayRequest(account_id, gateway, request.url.path, request_type, steps,
                              universal)
        return await unless_disconnected(request.receive, self.state.pipeline.handle(call))

    def _account(self, request: Request) -> str:
        account_id = request.path_params["account_id"]
        self.state.auth.check(request.headers, account_id)
        return account_id

    def _gateway_of(self, request: Request) -> tuple[str, GatewayConfig]:
        account_id = self._account(request)  # before the gateway: nothing is created unasked
        return account_id, self._authorized(request, account_id,
                                            request.path_params["gateway_id"])

    def _authorized(self, request: Request, account_id: str, gateway_id: str) -> GatewayConfig:
        """The gateway, once its own authentication (cf-aig-authorization) passes, whichever
        route (AI Gateway URL or Workers AI REST with cf-aig-gateway-id) names it."""
        gateway = self.gateway(account_id, gateway_id)
        if gateway.authentication:
            self.state.auth.check(request.headers, account_id, gateway)
        return gateway

    def gateway(self, account_id: str, gateway_id: str) -> GatewayConfig:
        """The account's gateway by id (`default` is created on first use); 1004 if none."""
        if gateway_id == "default":
            return self.state.gateways.get_or_create_default(account_id)
        gateway = self.state.gateways.get(account_id, gateway_id)
        if gateway is None:
            raise NotFoundError(f"gateway {gateway_id!r} not found", field="gateway_id")
        return gateway


def _stream_and_model(body: bytes) -> tuple[bool, str | None]:
    try:
        data = json.loads(body) if body else {}
    except ValueError:
        return False, None  # the upstream reports the bad body in its own words
    if not isinstance(data, dict):
        return False, None
    model = data.get("model")
    return data.get("stream") is True, model if isinstance(model, str) else None
