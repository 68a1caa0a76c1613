"""The provider contract: one upstream call in, one (possibly streamed) response out."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from edgefire.contract.catalog import Catalog
from edgefire.contract.errors import UpstreamError
from edgefire.contract.headers import MINIATURE, PROMPT_TOKENS, WEIGHT_PRECISION
from edgefire.gateway.node_auth import NodeCredentials


@dataclass(slots=True)
class UpstreamRequest:
    account_id: str
    path: str  # provider-relative: a model id ("@cf/…") or an API path ("v1/chat/completions")
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)  # forwarded to the upstream
    method: str = "POST"
    stream: bool = False
    session_id: str | None = None  # x-session-affinity
    location: tuple[float, float] | None = None  # the client's, for nearest-node routing


@dataclass(slots=True)
class UpstreamResponse:
    status: int
    headers: dict[str, str]
    body: bytes = b""  # the whole body, unless streamed
    chunks: AsyncIterator[bytes] | None = None  # the body as it arrives, when streamed
    close: Callable[[], Awaitable[None]] | None = None  # releases a streamed upstream
    node: str | None = None  # the edge node that answered, for logs

    @property
    def ok(self) -> bool:
        return self.status < 400


# What the client sees of an upstream's headers: the body's type, and what the edge node says
# of the answer (its request id; the precision of the weights that made it; a miniature's note).
_KEPT_HEADERS = ("content-type", "cf-ai-req-id", WEIGHT_PRECISION, PROMPT_TOKENS, MINIATURE)


@dataclass(slots=True)
class ProviderContext:
    """What a provider factory may use; built once when the gateway starts."""

    catalog: Catalog
    http: httpx.AsyncClient
    directory: object  # edgefire.gateway.routing.directory.NodeDirectory
    node_credentials: NodeCredentials  # which secret to send to each node
    settings: dict  # this provider's section of gateway.yaml
    stand_in_model: str | None = None  # EDGEFIRE_STAND_IN_MODEL (edgefire.gateway.stand_in)


class Provider(Protocol):
    name: str

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        """Call the upstream once; raise UpstreamError when it cannot be reached."""
        ...


async def forward(http: httpx.AsyncClient, method: str, url: str, request: UpstreamRequest,
                  headers: dict[str, str], node: str | None = None) -> UpstreamResponse:
    """Send to url; a streamed response is handed on chunk by chunk, never buffered."""
    try:
        upstream = await http.send(http.build_request(method, url, content=request.body,
                                                      headers=headers), stream=True)
    except httpx.TransportError as exc:
        raise UpstreamError(f"upstream unreachable: {exc.__class__.__name__}") from exc
    kept = {k: v for k, v in upstream.headers.items() if k.lower() in _KEPT_HEADERS}
    if request.stream and upstream.status_code == 200:
        return UpstreamResponse(upstream.status_code, kept, chunks=upstream.aiter_raw(),
                                close=upstream.aclose, node=node)
    try:
        body = await upstream.aread()
    except httpx.TransportError as exc:
        raise UpstreamError(f"upstream failed mid-response: {exc.__class__.__name__}") from exc
    finally:
        await upstream.aclose()
    return UpstreamResponse(upstream.status_code, kept, body=body, node=node)
