"""Stop work for a caller that went away: a non-streamed request's client closing early.

Starlette does not cancel a handler when its client disconnects, so a non-streamed request
would keep generating (and hold its KV blocks) until max_tokens or the request timeout. Here
the handler's work races the connection: once the body is read, the ASGI server's next
message for the request is `http.disconnect`, sent when the client closes (or, harmlessly,
after the response is complete). Streams need none of this: their response listens itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive

from edgefire.contract.errors import ClientGoneError

T = TypeVar("T")


async def unless_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """work's result; if the client disconnects first, work is cancelled (its clean-up runs,
    aborting engine requests) and ClientGoneError raised."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (watcher, task):
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pending
    if task.cancelled():
        raise ClientGoneError()
    return task.result()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass  # more request body after we read it all: nothing to do with it
