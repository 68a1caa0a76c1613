"""Operations endpoints: `GET /health` (503 until the node is ready) and `GET /metrics`."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.server.metrics import ServerMetrics


class OpsRoutes:
    def __init__(self, node: EdgeNode, metrics: ServerMetrics) -> None:
        self.node = node
        self.metrics = metrics

    async def health(self, request: Request) -> Response:
        return JSONResponse(self.node.health(), 200 if self.node.ready else 503)

    async def prometheus(self, request: Request) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)
