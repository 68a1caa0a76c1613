"""Built-in gateway providers: the edge fleet (`workers-ai`) and OpenAI-compatible upstreams."""

from __future__ import annotations

from edgefire.gateway.plugins import hookimpl
from edgefire.gateway.providers.openai_compatible import OpenAICompatibleProvider
from edgefire.gateway.providers.workers_ai import WorkersAIProvider


@hookimpl
def edgefire_register_providers(register):
    register("workers-ai", lambda name, context: WorkersAIProvider(context))
    register("openai-compatible", OpenAICompatibleProvider)
