"""Providers: how the gateway turns a request into an upstream call (edge fleet or a URL)."""

from edgefire.contract.errors import UpstreamError
from edgefire.gateway.providers.base import (
    Provider,
    ProviderContext,
    UpstreamRequest,
    UpstreamResponse,
)

__all__ = ["Provider", "ProviderContext", "UpstreamError", "UpstreamRequest", "UpstreamResponse"]
