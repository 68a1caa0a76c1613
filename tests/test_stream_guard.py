"""The gateway's stream guard: whole events out, and a clean error event if the upstream fails."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx

from edgefire.gateway.stream_guard import guarded

SSE = {"content-type": "text/event-stream"}


async def _chunks(parts: list[bytes], fail: bool) -> AsyncIterator[bytes]:
    for part in parts:
        yield part
    if fail:
        raise httpx.RemoteProtocolError("peer closed connection")


def _relay(parts: list[bytes], fail: bool, headers: dict = SSE, openai: bool = False) -> bytes:
    async def collect() -> bytes:
        return b"".join([c async for c in guarded(_chunks(parts, fail), headers, openai)])

    return asyncio.run(collect())


def test_an_upstream_failing_mid_event_ends_with_whole_events_and_an_error_event():
    body = _relay([b'data: {"response":"a"}\n\ndata: {"resp', b'onse":"b"}\n', b"\ndata: {"],
                  fail=True)
    events = [json.loads(e[6:]) for e in body.decode().split("\n\n") if e]
    assert events[:2] == [{"response": "a"}, {"response": "b"}]
    assert events[2]["success"] is False and events[2]["errors"][0]["code"] == 3040
    assert len(events) == 3 and body.endswith(b"\n\n")


def test_openai_routes_get_an_openai_error_event_and_crlf_events_stay_whole():
    body = _relay([b'data: {"x":1}\r\n\r\ndata: {"x"'], fail=True, openai=True)
    first, error = body.split(b"\r\n\r\n")
    assert first == b'data: {"x":1}'
    assert json.loads(error.strip()[6:])["error"]["code"] == "3040"


def test_a_clean_stream_is_passed_on_unchanged():
    parts = [b'data: {"response":"a"}\n\n', b"data: [DONE]\n\n"]
    assert _relay(parts, fail=False) == b"".join(parts)
    assert _relay([b"{not sse"], fail=False, headers={"content-type": "application/json"}) \
        == b"{not sse"
