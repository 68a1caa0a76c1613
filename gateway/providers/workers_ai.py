"""The `workers-ai` provider: the edge fleet, reached through the nearest suitable node."""

from __future__ import annotations

import json

from edgefire.contract.errors import (
    FleetStartingError,
    InvalidInputError,
    NoNodeError,
    UpstreamError,
)
from edgefire.contract.headers import NODE_SECRET
from edgefire.gateway.providers.base import (
    ProviderContext,
    UpstreamRequest,
    UpstreamResponse,
    forward,
)

_OPENAI_PATHS = ("v1/chat/completions", "v1/embeddings")


class WorkersAIProvider:
    name = "workers-ai"

    def __init__(self, context: ProviderContext) -> None:
        self.context = context

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        """Try the best node; if it cannot be reached, mark it and try the next one once."""
        model_id = _model_of(request)
        # Unknown (5007) or planning-only (5018): said before any node is bothered.
        spec = self.context.catalog.get_runnable(model_id)
        need = int(spec.extra.get("memory_mib", 0)) << 20
        directory = self.context.directory
        session = (request.account_id, request.session_id) if request.session_id else None
        nodes = directory.candidates(spec.id, need, request.location, session)
        if not nodes and directory.starting:
            if not await directory.wait_until_ready():
                raise FleetStartingError()
            nodes = directory.candidates(spec.id, need, request.location, session)
        if not nodes:
            raise NoNodeError()
        last: UpstreamError | None = None
        for node in nodes[:2]:
            url = f"{node.url}/client/v4/accounts/{request.account_id}/ai/{_node_path(request)}"
            try:
                response = await forward(self.context.http, request.method, url, request,
                                         self._headers(node.credential), node=node.city)
            except UpstreamError as exc:
                directory.mark_failed(node.city)
                last = exc
                continue
            if session and response.ok:
                directory.pin(*session, node.city)
            return response
        raise last or NoNodeError()

    def _headers(self, credential: str) -> dict[str, str]:
        """The node checks the secret of the credential its city is bound to (its own)."""
        headers = {"content-type": "application/json"}
        secret = self.context.node_credentials.secret(credential)
        if secret:
            headers[NODE_SECRET] = secret
        return headers


def _node_path(request: UpstreamRequest) -> str:
    path = request.path.lstrip("/")
    return path if path in _OPENAI_PATHS else f"run/{path}"


def _model_of(request: UpstreamRequest) -> str:
    path = request.path.lstrip("/")
    if path not in _OPENAI_PATHS:
        return path
    try:
        model = json.loads(request.body or b"{}").get("model")
    except (ValueError, AttributeError):
        model = None
    if not isinstance(model, str) or not model:
        raise InvalidInputError("model is required", field="model")
    return model
