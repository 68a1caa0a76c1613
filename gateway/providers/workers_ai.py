"""The `workers-ai` provider: the edge fleet, reached through the nearest suitable node."""

from __future__ import annotations

import json
from dataclasses import replace

from edgefire.contract.errors import (
    FleetStartingError,
    InvalidInputError,
    NoNodeError,
    UpstreamError,
)
from edgefire.contract.headers import NODE_SECRET, PREFILL_NODE, STAND_IN
from edgefire.gateway.providers.base import (
    ProviderContext,
    UpstreamRequest,
    UpstreamResponse,
    forward,
)
from edgefire.gateway.routing.directory import NodeState
from edgefire.gateway.routing.placement import Placement
from edgefire.gateway.stand_in import StandIns

_OPENAI_PATHS = ("v1/chat/completions", "v1/embeddings")


class WorkersAIProvider:
    name = "workers-ai"

    def __init__(self, context: ProviderContext) -> None:
        self.context = context
        self.placement = Placement()
        self.stand_ins = StandIns(context.catalog, context.stand_in_model, self.placement)

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        """Try the best node; if it cannot be reached, mark it and try the next one once."""
        model_id = _model_of(request)
        # Unknown (5007), or no node can host it and no stand-in may (5018): said before any
        # node is bothered.
        spec, stood_in = self.stand_ins.serving(model_id, self.context.directory)
        if stood_in:
            request = _for_stand_in(request, spec.id)
        need = spec.need_bytes
        directory = self.context.directory
        session = (request.account_id, request.session_id) if request.session_id else None

        def may_host(node: NodeState) -> bool:
            return self.placement.may_host(spec, node)

        nodes = directory.candidates(spec.id, need, request.location, session,
                                     may_host=may_host)
        if not nodes and directory.starting:
            if not await directory.wait_until_ready():
                raise FleetStartingError()
            # The first node's heartbeat is news to placement as well as to the budget check.
            spec, stood_in = self.stand_ins.serving(model_id, directory)
            if stood_in:
                request = _for_stand_in(request, spec.id)
            nodes = directory.candidates(spec.id, spec.need_bytes, request.location, session,
                                         may_host=may_host)
        if not nodes:
            raise NoNodeError()
        last: UpstreamError | None = None
        for node in nodes[:2]:
            url = f"{node.url}/client/v4/accounts/{request.account_id}/ai/{_node_path(request)}"
            headers = self._headers(node.credential)
            if node.role == "decode":
                prefill = directory.prefill_node(spec.id, need, node, may_host)
                if prefill is not None:
                    headers[PREFILL_NODE] = prefill.url
            try:
                response = await forward(self.context.http, request.method, url, request,
                                         headers, node=node.city)
            except UpstreamError as exc:
                directory.mark_failed(node.key)
                last = exc
                continue
            if session and response.ok:
                directory.pin(*session, node.key)
            if stood_in:
                response.headers[STAND_IN] = spec.id
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


def _for_stand_in(request: UpstreamRequest, model: str) -> UpstreamRequest:
    """request addressed to the stand-in: its run path, or its OpenAI body's `model`."""
    path = request.path.lstrip("/")
    if path not in _OPENAI_PATHS:
        return replace(request, path=model)
    return replace(request, body=json.dumps({**json.loads(request.body), "model": model}).encode())


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
