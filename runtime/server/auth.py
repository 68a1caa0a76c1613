"""The node secret: when set, API requests must carry it (the gateway does), else 401."""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from edgefire.contract.errors import AuthenticationError
from edgefire.contract.headers import NODE_SECRET
from edgefire.runtime.node.node import EdgeNode


class NodeSecretMiddleware:
    def __init__(self, app: ASGIApp, node: EdgeNode) -> None:
        self.app = app
        self.node = node

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Read per request, so a secret rotated in the settings applies at once.
        secret = self.node.settings.node_secret
        if secret and scope["type"] == "http":
            given = Headers(scope=scope).get(NODE_SECRET, "")
            if not hmac.compare_digest(given.encode(), secret.encode()):
                raise AuthenticationError()
        await self.app(scope, receive, send)
