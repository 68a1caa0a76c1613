"""Stop working for a client that has gone away.

Starlette runs a route to its end even when the client disconnects, so a non-streamed
request would keep its upstream call (and the node's generation) going for nobody. Streamed
answers need nothing more: the response stops at its next chunk and closes the upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

from starlette.responses import Response
from starlette.types import Receive

CLIENT_CLOSED = 499  # nginx's "client closed request": there is nobody left to read it


async def unless_client_leaves(receive: Receive,
                               work: Coroutine[Any, Any, Response]) -> Response:
    """work's response (or its exception, as raised); if the client leaves first, work is
    cancelled, which closes its upstream connections, so the node can stop generating.

    Call once the request body has been read: the next ASGI message is then the disconnect.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this request is cancelled itself (the server shutting down)
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        return Response(status_code=CLIENT_CLOSED)
    return task.result()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
