"""Account administration over REST: gateways (CRUD) and their logs; node heartbeats."""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edgefire.contract.bodies import page_number, read_json
from edgefire.contract.envelope import success
from edgefire.contract.errors import InvalidInputError, NotFoundError
from edgefire.contract.headers import NODE_SECRET
from edgefire.gateway.auth import check_admin
from edgefire.gateway.logs import LogRecord, scalar_object
from edgefire.gateway.state import GatewayState


class AdminRoutes:
    def __init__(self, state: GatewayState) -> None:
        self.state = state

    def _account(self, request: Request) -> str:
        account_id = request.path_params["account_id"]
        self.state.auth.check(request.headers, account_id)
        return account_id

    async def list_gateways(self, request: Request) -> Response:
        account_id = self._account(request)
        return success([g.to_json() for g in self.state.gateways.list(account_id)])

    async def create_gateway(self, request: Request) -> Response:
        account_id = self._account(request)
        body = await read_json(request, self.state.settings.max_request_bytes)
        return success(self.state.gateways.create(account_id, body).to_json())

    async def get_gateway(self, request: Request) -> Response:
        account_id = self._account(request)
        return success(self._gateway(account_id, request).to_json())

    async def update_gateway(self, request: Request) -> Response:
        account_id = self._account(request)
        body = await read_json(request, self.state.settings.max_request_bytes)
        gateway_id = request.path_params["gateway_id"]
        return success(self.state.gateways.update(account_id, gateway_id, body).to_json())

    async def delete_gateway(self, request: Request) -> Response:
        account_id = self._account(request)
        gateway_id = request.path_params["gateway_id"]
        if not self.state.gateways.delete(account_id, gateway_id):
            raise NotFoundError(f"gateway {gateway_id!r} not found", field="gateway_id")
        return success({"id": gateway_id})

    async def list_logs(self, request: Request) -> Response:
        account_id = self._account(request)
        gateway = self._gateway(account_id, request)
        q = request.query_params
        page, per_page = page_number(q, "page", 1), page_number(q, "per_page", 20)
        rows, total = self.state.logs.list(
            account_id, gateway.id, page=page, per_page=per_page, success=_bool(q, "success"),
            cached=_bool(q, "cached"), provider=q.get("provider"), model=q.get("model"),
            metadata=_metadata(q), order_desc=q.get("order_by_direction", "desc") != "asc")
        info = {"page": page, "per_page": per_page, "count": len(rows), "total_count": total}
        return success([r.to_json() for r in rows], info)

    async def get_log(self, request: Request) -> Response:
        return success(self._log(request).to_json())

    async def get_log_request(self, request: Request) -> Response:
        """The request body a log kept, as AI Gateway's `logs/{id}/request` gives it."""
        return success(_body(self._log(request).request_body))

    async def get_log_response(self, request: Request) -> Response:
        return success(_body(self._log(request).response_body))

    def _log(self, request: Request) -> LogRecord:
        account_id = self._account(request)
        gateway = self._gateway(account_id, request)
        record = self.state.logs.get(account_id, gateway.id, request.path_params["log_id"])
        if record is None:
            raise NotFoundError("log not found", field="log_id")
        return record

    async def delete_logs(self, request: Request) -> Response:
        account_id = self._account(request)
        gateway = self._gateway(account_id, request)
        q = request.query_params
        deleted = self.state.logs.delete(account_id, gateway.id, success=_bool(q, "success"),
                                         cached=_bool(q, "cached"), provider=q.get("provider"),
                                         model=q.get("model"), metadata=_metadata(q))
        return success({"deleted": deleted})

    def _gateway(self, account_id: str, request: Request):
        gateway_id = request.path_params["gateway_id"]
        gateway = self.state.gateways.get(account_id, gateway_id)
        if gateway is None:
            raise NotFoundError(f"gateway {gateway_id!r} not found", field="gateway_id")
        return gateway

    # Nodes report themselves here, with a node credential (gateway/node_auth.py).
    async def heartbeat(self, request: Request) -> Response:
        credentials = self.state.node_credentials
        matches = credentials.authenticate(request.headers.get(NODE_SECRET, ""))
        body = await read_json(request, self.state.settings.max_heartbeat_bytes)
        city = body.get("city")
        credential = credentials.for_city(city if isinstance(city, str) else "", matches)
        node = self.state.directory.heartbeat(body, credential)
        return success({"city": node.city})

    async def nodes(self, request: Request) -> Response:
        """The directory, node URLs and load included: for the operator only."""
        check_admin(request.headers, self.state.settings.admin_token, "/internal/nodes")
        return JSONResponse(self.state.directory.to_json())

    async def health(self, request: Request) -> Response:
        """503 "no_nodes" while no node can take a request; "degraded" when only degraded nodes
        can, or Redis (when configured) does not answer."""
        healthy = self.state.directory.healthy()
        redis = await self.state.redis_health.state() if self.state.redis_health else "disabled"
        if not healthy:
            status = "no_nodes"
        elif redis == "unreachable" or all(n.status == "degraded" for n in healthy):
            status = "degraded"
        else:
            status = "ok"
        return JSONResponse({"status": status, "healthy_nodes": [n.key for n in healthy],
                             "redis": redis}, 503 if status == "no_nodes" else 200)


def _bool(query, name: str) -> bool | None:
    raw = query.get(name)
    if raw is None:
        return None
    if raw not in ("true", "false"):
        raise InvalidInputError(f"{name} must be true or false", field=name)
    return raw == "true"


def _metadata(query) -> dict | None:
    """`metadata`: a JSON object of scalar entries, all of which a log's metadata must have."""
    raw = query.get("metadata")
    return None if raw is None else scalar_object(raw, "metadata")


def _body(text: str | None) -> object:
    """A kept body as JSON when it is JSON (a truncated one is not), else as text."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text
