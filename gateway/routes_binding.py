"""A Worker's `env.AI`: the requests workerd's built-in `Ai` class makes through its fetcher,
answered as the binding expects (/work/shared/reference/worker-env-ai-offline.md).

  POST /run?version=3                            env.AI.run(model, inputs); cf-consn-model-id
  POST /ai-gateway/run?version=3                 env.AI.run(…, {gateway: {id, cacheTtl, …}})
  GET  /ai-api/models/search                     env.AI.models({search, task, …})
  GET  /ai-gateway/gateways/{id}/logs/{log_id}   env.AI.gateway(id).getLog(log_id)

Two ways reach here. A wrangler dev plugin (examples/worker/edgefire-wrangler-plugin) points the
binding's fetcher at the gateway, so the paths above arrive as they are. Miniflare's
`remoteProxyConnectionString` wraps each call instead: it is sent to that URL (`/` or any path
above) with the binding's own URL in `MF-URL` and each header renamed `MF-Header-<name>`. A call
is unwrapped first, so both ways share one dispatcher.

Answers: a success is the bare result object with content type exactly `application/json` (with
a charset the binding hands the Worker a stream instead of an object); a stream is the node's
SSE as it arrives; an error is a non-2xx `{"errors": [{"code", "message"}], …}`, which `run()`
throws as InferenceUpstreamError("<code>: <message>"). Inference goes through InferenceRoutes
and the pipeline like a REST call, so cache, logs, metadata and retries behave the same.

Authentication: the binding sends no account or token. A call with `Authorization: Bearer
<token>` (the plugin injects one when configured with it) runs as the token's account. Without
one, a call is served as `settings.binding_account` if that is set (edge-gateway dev sets the
dev account), the call comes from loopback and its Host is loopback or the binding's own
`workers-binding.ai`: a browser page on a DNS name rebound to 127.0.0.1 sends neither. Else
10000 (401).
"""

from __future__ import annotations

import ipaddress
import json
import re
import uuid
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from edgefire.contract.bodies import parse_json, read_body
from edgefire.contract.envelope import success
from edgefire.contract.errors import (
    AuthenticationError,
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
    REQUEST_ID,
)
from edgefire.contract.http_errors import error_body
from edgefire.gateway.auth import bearer
from edgefire.gateway.gateways import GatewayConfig
from edgefire.gateway.routes_inference import InferenceRoutes
from edgefire.gateway.state import GatewayState

# The paths a call may arrive at: the binding's own, and `/` for Miniflare's wrapped form.
BINDING_PATHS = ("/", "/run", "/ai-gateway/run", "/ai-api/models/search",
                 "/ai-gateway/gateways/{gateway_id}/logs/{log_id}")
BINDING_HOST = "workers-binding.ai"  # the host of every URL the binding fetches
MODEL_HEADER = "cf-consn-model-id"
_MF_URL, _MF_HEADER = "mf-url", "mf-header-"
_LOCAL_HOSTS = frozenset({"127.0.0.1", "::1", "localhost", BINDING_HOST})
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


@dataclass(frozen=True, slots=True)
class BindingCall:
    """One env.AI request as the binding made it, unwrapped from Miniflare's form if need be."""

    method: str
    path: str
    query: QueryParams
    headers: dict[str, str]  # lower-case names

    @classmethod
    def of(cls, request: Request) -> BindingCall:
        outer = dict(request.headers)
        target = outer.get(_MF_URL)
        if target is None:
            return cls(request.method, request.url.path, request.query_params, outer)
        url = urlsplit(target)
        # A header the proxy renamed wins over the outer request's own (its length, its host).
        headers = {name: value for name, value in outer.items() if not name.startswith("mf-")}
        headers |= {name[len(_MF_HEADER):]: value for name, value in outer.items()
                    if name.startswith(_MF_HEADER)}
        return cls(request.method, url.path or "/", QueryParams(url.query), headers)


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
        call = BindingCall.of(request)
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
        account_id = self._account(request, call)  # before a body is read
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
        model = call.headers.get(MODEL_HEADER)
        if not model:
            raise InvalidInputError(f"the {MODEL_HEADER} header is required", field=MODEL_HEADER)
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

    def _account(self, request: Request, call: BindingCall) -> str:
        token = bearer(call.headers.get("authorization"))
        if token is not None:
            account_id = self.state.accounts.authenticate(token)
            if account_id is None:
                raise AuthenticationError()
            return account_id
        account_id = self.state.settings.binding_account
        if account_id and _from_this_machine(request):
            return account_id
        raise AuthenticationError(
            "Authentication error: env.AI calls need an account token (Authorization: Bearer, "
            "which the wrangler plugin sends when given one); only `edge-gateway dev` serves "
            "them without one, from this machine")


def bare(response: Response) -> Response:
    """The REST answer as the binding wants it: a 200 envelope becomes its bare `result`;
    streams and errors (already `{"errors": [...]}`) pass through."""
    if isinstance(response, StreamingResponse) or response.status_code != 200:
        return response
    result = json.loads(response.body)["result"]
    headers = {name: value for name, value in response.headers.items()
               if name not in ("content-length", "content-type")}
    return Response(json.dumps(result).encode(), 200, headers, media_type=_JSON)


def _from_this_machine(request: Request) -> bool:
    """Loopback peer, and the outer Host is loopback or the binding's (never MF-Header-host:
    a page could set that one)."""
    try:
        peer = ipaddress.ip_address(request.client.host if request.client else "")
    except ValueError:
        return False
    host = urlsplit("//" + request.headers.get("host", "")).hostname
    return peer.is_loopback and host in _LOCAL_HOSTS
