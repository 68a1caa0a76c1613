"""A Worker's `env.AI`: the requests workerd's built-in `Ai` class makes through its fetcher,
answered as the binding expects (/work/shared/reference/worker-env-ai-offline.md).

  POST /run?version=3                            env.AI.run(model, inputs); cf-consn-model-id
  POST /ai-gateway/run?version=3                 env.AI.run(…, {gateway: {id, cacheTtl, …}})
  GET  /ai-api/models/search                     env.AI.models({search, task, …})
  GET  /ai-gateway/gateways/{id}/logs/{log_id}   env.AI.gateway(id).getLog(log_id)

Two ways reach here: a wrangler dev plugin (examples/worker/edgefire-wrangler-plugin) sends the
paths above as they are; Miniflare's `remoteProxyConnectionString` wraps each call (MF-URL,
MF-Header-*). edgefire.gateway.binding_call unwraps it, so both ways share one dispatcher, and
says who a call runs as (a bearer token's account, or the dev account from this machine).

Answers: a success is the bare result object with content type exactly `application/json` (with
a charset the binding hands the Worker a stream instead of an object); a stream is the node's
SSE as it arrives; an error is a non-2xx `{"errors": [{"code", "message"}], …}`, which `run()`
throws as InferenceUpstreamError("<code>: <message>"). Inference goes through InferenceRoutes
and the pipeline like a REST call, so cache, logs, metadata and retries behave the same.
"""

from __future__ import annotations

import json
import re
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from edgefire.contract.bodies import parse_json, read_body
from edgefire.contract.envelope import success
from edgefire.contract.errors import (
    EdgefireError,
    InvalidInputError,
    NotFoundError,
    RouteError,
)
from edgefire.contract.headers import (
    AIG_CACHE_KEY,
    AIG_CACHE_TTL,
    AIG_COLLECT_LOG,
    AIG_METADATA,
    AIG_SKIP_CACHE,
    BINDING_MODEL,
    REQUEST_ID,
)
from edgefire.contract.http_errors import error_body
from edgefire.gateway.binding_call import BindingCall, binding_account
from edgefire.gateway.gateways import GatewayConfig
from edgefire.gateway.routes_inference import InferenceRoutes
from edgefire.gateway.state import GatewayState

_LOG_PATH = re.compile(r"/ai-gateway/gateways/([^/]+)/logs/([^/]+)")
_JSON = "application/json"  # exactly: the binding compares the content type with ===
# options.gateway → the AI Gateway header with the same meaning, as the binding's own
# AiGateway.run names them, so a binding call is cached and logged as a REST call would be.
_GATEWAY_HEADERS = {"cacheTtl": AIG_CACHE_TTL, "skipCache": AIG_SKIP_CACHE,
                    "cacheKey": AIG_CACHE_KEY, "collectLog": AIG_COLLECT_LOG,
                    "metadata": AIG_METADATA, "requestTimeoutMs": "cf-aig-request-timeout",
                    "eventId": "cf-aig-event-id"}
_RETRY_HEADERS = {"maxAttempts": "cf-aig-max-attempts", "retryDelayMs": "cf-aig-retry-delay",
                  "backoff": "cf-aig-backoff"}


def gateway_headers(options: dict) -> dict[str, str]:
    """`options.gateway` of a run() as cf-aig-* headers (values checked where they are read)."""
    headers = {}
    for key, name in _GATEWAY_HEADERS.items():
        if options.get(key) is not None:
            headers[name] = _header_value(options[key])
    retries = options.get("retries")
    if isinstance(retries, dict):
        for key, name in _RETRY_HEADERS.items():
            if retries.get(key) is not None:
                headers[name] = _header_value(retries[key])
    return headers


def _header_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


class BindingRoutes:
    def __init__(self, state: GatewayState, infer: InferenceRoutes) -> None:
        self.state = state
        self.infer = infer

    async def handle(self, request: Request) -> Response:
        """Every binding path, both forms. Errors are rendered here so they carry a request id
        too (the app's handler would render the same body)."""
        call = BindingCall.of(request.scope)
        try:
            response = await self._dispatch(request, call)
        except EdgefireError as exc:
            response = JSONResponse(error_body(exc, openai=False), exc.status)
        if REQUEST_ID not in response.headers:
            response.headers[REQUEST_ID] = str(uuid.uuid4())
        return response

    async def _dispatch(self, request: Request, call: BindingCall) -> Response:
        logs = _LOG_PATH.fullmatch(call.path)
        known = call.path in ("/run", "/ai-gateway/run", "/ai-api/models/search") or logs
        if not known:
            raise RouteError(404)
        expected = "POST" if call.path.endswith("/run") else "GET"
        if call.method != expected:
            raise RouteError(405)
        # Who calls is settled before a body is read.
        account_id = binding_account(request.scope, call, self.state.accounts,
                                     self.state.settings.binding_account)
        if call.path == "/run":
            return await self._run(request, call, account_id, via_gateway=False)
        if call.path == "/ai-gateway/run":
            return await self._run(request, call, account_id, via_gateway=True)
        if logs:
            return self._log(account_id, logs.group(1), logs.group(2))
        return self.infer.catalog.listing(call.query)

    async def _run(self, request: Request, call: BindingCall, account_id: str,
                   via_gateway: bool) -> Response:
        if "userInputs" in call.query:
            raise InvalidInputError("edgefire's env.AI takes JSON inputs only, not a "
                                    "ReadableStream", field="inputs")
        model = call.headers.get(BINDING_MODEL)
        if not model:
            raise InvalidInputError(f"the {BINDING_MODEL} header is required",
                                    field=BINDING_MODEL)
        body = parse_json(await read_body(request, self.state.settings.max_request_bytes))
        inputs, options = body.get("inputs"), body.get("options")
        if not isinstance(inputs, dict):
            raise InvalidInputError("inputs must be an object", field="inputs")
        if options is not None and not isinstance(options, dict):
            raise InvalidInputError("options must be an object", field="options")
        headers = dict(call.headers)
        gateway = None
        if via_gateway:
            gateway, aig = self._gateway(account_id, (options or {}).get("gateway"))
            headers |= aig
        response = await self.infer.binding_run(request, account_id, gateway, model,
                                                json.dumps(inputs).encode(), headers)
        return bare(response)

    def _gateway(self, account_id: str, options: object) -> tuple[GatewayConfig, dict[str, str]]:
        """The gateway options.gateway names, and its options as headers. Its own
        authentication (cf-aig-authorization) is not asked for: the binding is the account's."""
        gateway_id = options.get("id") if isinstance(options, dict) else None
        if not isinstance(gateway_id, str) or not gateway_id:
            raise InvalidInputError("options.gateway.id must be a gateway id",
                                    field="options.gateway.id")
        return self.infer.gateway(account_id, gateway_id), gateway_headers(options)

    def _log(self, account_id: str, gateway_id: str, log_id: str) -> Response:
        if self.state.gateways.get(account_id, gateway_id) is None:
            raise NotFoundError(f"gateway {gateway_id!r} not found", field="gateway_id")
        record = self.state.logs.get(account_id, gateway_id, log_id)
        if record is None:
            raise NotFoundError("log not found", field="log_id")
        return success(record.to_json())


def bare(response: Response) -> Response:
    """The REST answer as the binding wants it: a 200 envelope becomes its bare `result`;
    streams and errors (already `{"errors": [...]}`) pass through."""
    if isinstance(response, StreamingResponse) or response.status_code != 200:
        return response
    result = json.loads(response.body)["result"]
    headers = {name: value for name, value in response.headers.items()
               if name not in ("content-length", "content-type")}
    return Response(json.dumps(result).encode(), 200, headers, media_type=_JSON)
