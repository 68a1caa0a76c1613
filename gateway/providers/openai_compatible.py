"""`openai-compatible` providers: any upstream speaking the OpenAI API at a configured URL."""

from __future__ import annotations

import os

from gateway.providers.base import ProviderContext, UpstreamRequest, UpstreamResponse, forward


class OpenAICompatibleProvider:
    """Configured in gateway.yaml: `{type: openai-compatible, base_url, api_key_env}`."""

    def __init__(self, name: str, context: ProviderContext) -> None:
        self.name = name
        self.context = context
        self.base_url = str(context.settings["base_url"]).rstrip("/")
        key_env = context.settings.get("api_key_env")
        self.api_key = os.environ.get(key_env) if key_env else context.settings.get("api_key")

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        headers = {"content-type": "application/json"}
        # The gateway's own credentials never travel upstream: the provider key does.
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        url = f"{self.base_url}/{request.path.lstrip('/')}"
        return await forward(self.context.http, request.method, url, request, headers)
