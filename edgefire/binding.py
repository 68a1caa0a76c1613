"""A Worker's `env.AI` binding for Python programs, spoken over the Workers AI REST API.

    async with AI.from_dev_file() as ai:
        answer = await ai.run("@cf/meta/llama-3.1-8b-instruct", {"prompt": "Hi"},
                              {"gateway": {"id": "default", "cacheTtl": 3600}})

It talks to an edgefire gateway (`make run`) or to api.cloudflare.com, whose paths are the
same: `run` without `options["gateway"]` is `POST …/ai/run/{model}`; with it, the AI Gateway
URL `/v1/{account}/{gateway}/workers-ai/{model}` and the gateway options as cf-aig-* headers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from edgefire.errors import (
    AiGatewayInternalError,
    AiGatewayLogNotFound,
    BindingError,
    InferenceUpstreamError,
)

DEFAULT_BASE_URL = "http://127.0.0.1:8787"
DEFAULT_DEV_FILE = ".edgefire/dev.json"

# GatewayOptions → the per-request headers AI Gateway reads (reference §5.3).
_GATEWAY_HEADERS = {
    "skipCache": "cf-aig-skip-cache", "cacheTtl": "cf-aig-cache-ttl",
    "cacheKey": "cf-aig-cache-key", "metadata": "cf-aig-metadata",
    "collectLog": "cf-aig-collect-log", "eventId": "cf-aig-event-id",
    "requestTimeoutMs": "cf-aig-request-timeout",
}
_RETRY_HEADERS = {"maxAttempts": "cf-aig-max-attempts", "retryDelayMs": "cf-aig-retry-delay",
                  "backoff": "cf-aig-backoff"}


def _segment(value: str) -> str:
    """value as one URL path segment: every reserved character escaped, and a dot segment
    ('.' or '..', which clients and servers collapse) spelt with escaped dots."""
    if value in (".", ".."):
        return "%2E" * len(value)
    return quote(value, safe="@")


def _model_path(model: str) -> str:
    """A model id as the gateway's `{model:path}` routes expect it: `@cf/meta/x` keeps its
    slashes; anything else in it (?, #, spaces, dot segments) arrives as written."""
    return "/".join(_segment(part) for part in model.split("/"))


def _header_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def gateway_headers(gateway: dict) -> dict[str, str]:
    """The cf-aig-* headers for a GatewayOptions dict; unset (None) options send nothing."""
    retries = gateway.get("retries") or {}
    pairs = [(h, gateway.get(k)) for k, h in _GATEWAY_HEADERS.items()]
    pairs += [(h, retries.get(k)) for k, h in _RETRY_HEADERS.items()]
    return {header: _header_value(value) for header, value in pairs if value is not None}


class AI:
    """`env.AI`: `run`, `models`, `gateway(id)`; after each `run`, `lastRequestId`,
    `aiGatewayLogId` and `lastRequestHttpStatusCode` describe its answer, as in workerd."""

    def __init__(self, base_url: str, account_id: str, token: str, *,
                 http: httpx.AsyncClient | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.account_id = account_id
        self._auth = {"authorization": f"Bearer {token}"}
        self._owns_http = http is None
        # Generation can take minutes before its first byte; only connecting should fail fast.
        self._http = http or httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0))
        self.lastRequestId: str | None = None
        self.aiGatewayLogId: str | None = None
        self.lastRequestHttpStatusCode: int | None = None

    @classmethod
    def from_dev_file(cls, path: str | Path = DEFAULT_DEV_FILE, base_url: str | None = None,
                      *, http: httpx.AsyncClient | None = None) -> AI:
        """The development account that `make run` keeps in .edgefire/dev.json, at the
        gateway that file names (else base_url, else http://127.0.0.1:8787)."""
        saved = json.loads(Path(path).read_text())
        base_url = base_url or saved.get("gateway_url") or DEFAULT_BASE_URL
        return cls(base_url, saved["account_id"], saved["token"], http=http)

    async def __aenter__(self) -> AI:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    @property
    def account_url(self) -> str:
        return f"{self.base_url}/client/v4/accounts/{_segment(self.account_id)}"

    async def run(self, model: str, inputs: dict, options: dict | None = None) -> Any:
        """The parsed `result`; for `stream: true` inputs, an async iterator of SSE events
        (dicts, ending before `[DONE]`; `aclose()` it to stop early); for a non-JSON answer,
        its bytes. `returnRawResponse` returns the httpx.Response as it is, errors included;
        a streamed one is left open for the caller to read and close."""
        options = options or {}
        gateway = options.get("gateway")
        headers = dict(self._auth)
        if gateway is None:
            url = f"{self.account_url}/ai/run/{_model_path(model)}"
        else:
            url = f"{self.gateway(gateway['id']).get_url('workers-ai')}/{_model_path(model)}"
            # Binding calls are pre-authenticated, so they pass gateways that require auth.
            headers["cf-aig-authorization"] = headers["authorization"]
            headers |= gateway_headers(gateway)
        headers |= options.get("extraHeaders") or {}
        body = dict(inputs)
        if options.get("rejectIfBusy"):
            body["options"] = {**(body.get("options") or {}), "rejectIfBusy": True}
        streamed = inputs.get("stream") is True
        # Async batch: {requests: [...]} is queued and answered {status, request_id}; poll
        # with run(model, {request_id}).
        params = {"queueRequest": "true"} if options.get("queueRequest") else None
        request = self._http.build_request("POST", url, json=body, headers=headers,
                                           params=params)
        response = await self._http.send(request, stream=True)
        self.lastRequestId = response.headers.get("cf-ai-req-id")
        self.aiGatewayLogId = response.headers.get("cf-aig-log-id")
        self.lastRequestHttpStatusCode = response.status_code
        if streamed and response.is_success:
            return response if options.get("returnRawResponse") else _events(response)
        await _read(response)
        if options.get("returnRawResponse"):
            return response
        if not response.is_success:
            raise InferenceUpstreamError.from_response(response)
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()["result"]
        return response.content

    async def models(self, params: dict | None = None) -> list[dict]:
        """Catalog entries (`…/ai/models/search`), filtered by `search`, `task`, `author`, …"""
        return await self._get("/ai/models/search", InferenceUpstreamError, params=params)

    def gateway(self, gateway_id: str) -> Gateway:
        return Gateway(self, gateway_id)

    async def _get(self, path: str, error: type[BindingError], *, params: dict | None = None,
                   not_found: type[BindingError] | None = None) -> Any:
        response = await self._http.get(self.account_url + path, params=params,
                                        headers=self._auth)
        if response.is_success:
            return response.json()["result"]
        if not_found is not None and response.status_code == 404:
            error = not_found
        raise error.from_response(response)


class Gateway:
    """`env.AI.gateway(id)`: an AI Gateway of the binding's account."""

    def __init__(self, ai: AI, gateway_id: str) -> None:
        self.ai = ai
        self.id = gateway_id

    def get_url(self, provider: str | None = None) -> str:
        """The gateway's base URL, or a provider's under it. Unlike Cloudflare's, the universal
        URL has no trailing slash: the emulator's route does not take one."""
        url = f"{self.ai.base_url}/v1/{_segment(self.ai.account_id)}/{_segment(self.id)}"
        return f"{url}/{_segment(provider)}" if provider else url

    async def get_log(self, log_id: str) -> dict:
        """A log, its `metadata` an object as the binding's AiGatewayLog has it (REST sends a
        JSON string); AiGatewayLogNotFound when there is no such log."""
        log = await self.ai._get(f"/ai-gateway/gateways/{_segment(self.id)}/logs/"
                                 f"{_segment(log_id)}",
                                 AiGatewayInternalError, not_found=AiGatewayLogNotFound)
        if isinstance(log.get("metadata"), str):
            log["metadata"] = json.loads(log["metadata"])
        return log


async def _read(response: httpx.Response) -> None:
    try:
        await response.aread()
    finally:
        await response.aclose()


async def _events(response: httpx.Response) -> AsyncIterator[dict]:
    """Server-sent events' `data` as JSON, until `[DONE]` or the end of the stream."""
    try:
        data: list[str] = []
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            elif not line and data:
                event, data = _decode(data), []
                if event is None:
                    return
                yield event
        if data and (event := _decode(data)) is not None:
            yield event
    finally:
        await response.aclose()


def _decode(data: list[str]) -> dict | None:
    payload = "\n".join(data)
    return None if payload == "[DONE]" else json.loads(payload)
