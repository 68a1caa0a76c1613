"""The gateway plugin: a `dummy-echo` provider that answers every request itself."""

from __future__ import annotations

import json

from edgefire.gateway.plugins import hookimpl
from edgefire.gateway.providers.base import ProviderContext, UpstreamRequest, UpstreamResponse


class EchoProvider:
    """Answers with its own name and the path it was asked for, without any upstream."""

    def __init__(self, name: str, context: ProviderContext) -> None:
        self.name = name

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        body = json.dumps({"provider": self.name, "path": request.path}).encode()
        return UpstreamResponse(200, {"content-type": "application/json"}, body=body)


@hookimpl
def edgefire_register_providers(register):
    register("dummy-echo", EchoProvider)
