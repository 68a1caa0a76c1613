"""Server-sent events: `data: {json}` per event, `data: [DONE]` at the end."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from edgefire.contract.http_errors import as_api_error, error_body

log = logging.getLogger(__name__)

DONE = "data: [DONE]\n\n"


def encode_event(event: dict) -> str:
    return f"data: {json.dumps(event, ensure_ascii=False, separators=(',', ':'))}\n\n"


class EventStream(StreamingResponse):
    """An SSE response whose `on_close` runs however it ends: done, failed or client gone.

    A client that goes away cancels the body's task; a body cancelled before it started runs
    no clean-up of its own, so the clean-up hangs on the response call instead.
    """

    def __init__(self, events: AsyncIterator[dict], on_close: Callable[[], Awaitable[None]],
                 *, openai: bool, headers: dict[str, str] | None = None) -> None:
        super().__init__(_encode(events, openai), media_type="text/event-stream",
                         headers={"cache-control": "no-cache", **(headers or {})})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # A disconnect cancels this task; the clean-up (abort, free KV) must still run.
            with anyio.CancelScope(shield=True):
                await self._on_close()


async def _encode(events: AsyncIterator[dict], openai: bool) -> AsyncIterator[str]:
    try:
        async for event in events:
            yield encode_event(event)
    except Exception as exc:  # the status line is sent: report in the stream, then stop
        log.exception("event stream failed")
        yield encode_event(error_body(as_api_error(exc), openai))
        return
    yield DONE
