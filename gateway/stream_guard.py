"""A streamed answer that ends cleanly even when its upstream does not.

Once the gateway has sent a stream's status line it can no longer answer with an error status.
Without this guard, an edge node that dies mid-answer leaves the client a truncated body: half
an event and a connection dropped without the chunked body's end. With it, the client gets the
whole events that arrived, then one `data:` event carrying the error in the envelope its route
speaks, and a properly closed stream (no `[DONE]`), just as a node ends a stream that fails.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping

import httpx

from edgefire.contract.errors import UpstreamError
from edgefire.contract.http_errors import as_api_error, error_body
from edgefire.contract.sse import encode_event

log = logging.getLogger(__name__)

_BOUNDARIES = (b"\n\n", b"\r\n\r\n")  # the blank line that ends an SSE event


def guarded(chunks: AsyncIterator[bytes], headers: Mapping[str, str],
            openai: bool) -> AsyncIterator[bytes]:
    """chunks as they are, unless they are an event stream: then whole_events(chunks)."""
    if not headers.get("content-type", "").startswith("text/event-stream"):
        return chunks
    return whole_events(chunks, openai)


async def whole_events(chunks: AsyncIterator[bytes], openai: bool) -> AsyncIterator[bytes]:
    """Complete events only (half of one cannot be parsed); an error event if chunks fail."""
    pending = b""
    try:
        async for chunk in chunks:
            pending += chunk
            end = max((pending.rfind(b) + len(b) for b in _BOUNDARIES if b in pending),
                      default=0)
            if end:
                yield pending[:end]
                pending = pending[end:]
    except Exception as exc:  # whatever broke, the client gets a clean end
        if isinstance(exc, httpx.TransportError):
            log.warning("upstream stream failed: %s", exc.__class__.__name__)
            error = UpstreamError(f"upstream failed mid-stream: {exc.__class__.__name__}")
        else:
            log.exception("upstream stream failed")
            error = as_api_error(exc)
        yield encode_event(error_body(error, openai)).encode()
        return
    if pending:  # an upstream that ends without a final blank line: pass on what it sent
        yield pending
