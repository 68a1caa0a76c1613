"""Providers: how the gateway turns a request into an upstream call (edge fleet or a URL)."""

from edgefire.gateway.providers.base import (
    Provider,
    ProviderContext,
    UpstreamError,
    UpstreamRequest,
    UpstreamResponse,
)

__all__ = ["Provider", "ProviderContext", "UpstreamError", "UpstreamRequest", "UpstreamResponse"]
