"""`openai-compatible` providers: any upstream speaking the OpenAI API at a configured URL.

The provider key is the operator's, so a client may reach only the API paths the operator
allows (gateway.yaml `allowed_paths`, default DEFAULT_ALLOWED_PATHS), spelt plainly: no dot
segments, percent-escapes, query or fragment, and the URL built must stay under base_url.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from edgefire.contract.errors import ConfigError, InvalidInputError
from edgefire.gateway.providers.base import (
    ProviderContext,
    UpstreamRequest,
    UpstreamResponse,
    forward,
)

# The OpenAI API's POST endpoints for inference, with or without the version prefix (base_url
# may or may not end in /v1). Files, fine-tuning, batches and the like are left out: they act
# on the operator's account rather than answer a prompt.
_INFERENCE = ("chat/completions", "completions", "embeddings", "moderations", "responses",
              "images/generations", "audio/speech", "audio/transcriptions")
DEFAULT_ALLOWED_PATHS = (*_INFERENCE, *(f"v1/{p}" for p in _INFERENCE))
_FORBIDDEN_CHARS = set("?#%\\")


class OpenAICompatibleProvider:
    """Configured in gateway.yaml: `{type: openai-compatible, base_url, api_key_env,
    allowed_paths}`."""

    def __init__(self, name: str, context: ProviderContext) -> None:
        self.name = name
        self.context = context
        self.base_url = str(context.settings["base_url"]).rstrip("/")
        key_env = context.settings.get("api_key_env")
        self.api_key = os.environ.get(key_env) if key_env else context.settings.get("api_key")
        allowed = context.settings.get("allowed_paths", DEFAULT_ALLOWED_PATHS)
        if not isinstance(allowed, list | tuple) or not all(isinstance(p, str) for p in allowed):
            raise ConfigError(f"gateway.yaml: providers.{name}.allowed_paths must be a list "
                              "of paths")
        self.allowed_paths = frozenset(p.strip("/") for p in allowed)

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        headers = {"content-type": "application/json"}
        # The gateway's own credentials never travel upstream: the provider key does.
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        url = self.url_for(request.path)
        return await forward(self.context.http, request.method, url, request, headers)

    def url_for(self, path: str) -> str:
        """base_url joined with an allowed path, or InvalidInputError (5006) naming it."""
        clean = path.strip("/")
        segments = clean.split("/")
        if (_FORBIDDEN_CHARS & set(path) or any(s in ("", ".", "..") for s in segments)
                or not clean.isprintable() or any(c.isspace() for c in clean)):
            raise InvalidInputError(f"{self.name}: the upstream path {path!r} must be plain "
                                    "segments without '.', '..', escapes, query or fragment",
                                    field="path")
        if clean not in self.allowed_paths:
            raise InvalidInputError(f"{self.name}: the upstream path {clean!r} is not allowed "
                                    f"(allowed: {', '.join(sorted(self.allowed_paths))})",
                                    field="path")
        url = f"{self.base_url}/{clean}"
        base, built = urlsplit(self.base_url), urlsplit(url)
        # A second line of defence, should an allowed path ever be written oddly.
        assert (built.scheme, built.netloc) == (base.scheme, base.netloc) \
            and built.path.startswith(base.path.rstrip("/") + "/"), url
        return url
