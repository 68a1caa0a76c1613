"""A stand-in upstream (edge node or OpenAI-compatible API) that records what reached it, and
a gateway served over real HTTP in front of it, for the gateway's security tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from edgefire.gateway.app import create_app
from edgefire.gateway.db import Database
from edgefire.gateway.settings import GatewaySettings
from edgefire.gateway.state import GatewayState

MODEL = "@cf/huggingfacetb/smollm2-135m-instruct"
ANSWER = {"result": {"response": "hi"}, "success": True, "errors": [], "messages": []}


async def read_json(receive) -> dict:
    """An ASGI request's whole body as JSON ({} when empty): what every fake upstream reads."""
    raw, more = b"", True
    while more:
        message = await receive()
        raw += message.get("body", b"")
        more = message.get("more_body", False)
    return json.loads(raw) if raw else {}


@dataclass(slots=True)
class Seen:
    path: str  # as sent on the wire, escapes included
    query: str
    headers: dict[str, str]
    body: dict


@dataclass
class RecordingUpstream:
    """Answers every request with ANSWER (or `status`); a body with `"hang": true` gets no
    answer until the caller disconnects, which sets `disconnected`."""

    status: int = 200
    seen: list[Seen] = field(default_factory=list)
    disconnected: threading.Event = field(default_factory=threading.Event)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = await read_json(receive)
        self.seen.append(Seen(scope["raw_path"].decode(), scope["query_string"].decode(),
                              {k.decode(): v.decode() for k, v in scope["headers"]}, body))
        if body.get("hang"):
            while (await receive())["type"] != "http.disconnect":
                pass
            self.disconnected.set()
            return
        await send({"type": "http.response.start", "status": self.status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": json.dumps(ANSWER).encode()})


def heartbeat(url: str, city: str = "fra", **extra) -> dict:
    """An idle node with MODEL loaded; Frankfurt's coordinates unless told."""
    where = {"fra": (50.11, 8.68), "sin": (1.35, 103.82), "lhr": (51.47, -0.45)}[city]
    return {"city": city, "url": url, "lat": where[0], "lon": where[1],
            "memory_budget_bytes": 1 << 40, "accelerator_bytes": 0,
            "loaded_models": {MODEL: {}}, "running": 0, "waiting": 0, "kv_usage": 0.0} | extra


@dataclass(slots=True)
class Gateway:
    url: str
    state: GatewayState
    account_id: str
    token: str

    def client(self, timeout: float | httpx.Timeout = 30) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout,
                            headers={"authorization": f"Bearer {self.token}"})

    def beat(self, payload: dict, secret: str | None) -> httpx.Response:
        headers = {"x-edgefire-node-secret": secret} if secret else {}
        return httpx.post(f"{self.url}/internal/nodes/heartbeat", json=payload, headers=headers)


@contextlib.contextmanager
def gateway(serve, tmp_path: Path, config: dict | None = None,
            **settings) -> Iterator[Gateway]:
    """A gateway (in-memory database, memory cache) with one account, served over HTTP."""
    path = None
    if config is not None:
        path = tmp_path / "gateway.yaml"
        path.write_text(yaml.safe_dump(config))
    state = GatewayState.build(GatewaySettings(gateway_config=path, redis_url=None, **settings),
                               db=Database(":memory:"))
    account_id = state.accounts.create_account("a").id
    _, token = state.accounts.create_token(account_id)
    with serve(create_app(state)) as url:
        yield Gateway(url, state, account_id, token)


@dataclass
class CountingNode:
    """An edge node stand-in that answers differently each call ("answer 1", "answer 2", …), as
    a sampled model does: `stream: true` gets three SSE events `gap_s` apart, the prompt "fail"
    a 400 envelope, and the OpenAI chat route an OpenAI body. Register it with heartbeat()."""

    gap_s: float = 0.2
    calls: int = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = await read_json(receive)
        self.calls += 1
        text = f"answer {self.calls}"
        if body.get("prompt") == "fail":
            await _send(send, 400, b"application/json", [json.dumps(
                {"result": None, "success": False, "messages": [],
                 "errors": [{"code": 5006, "message": "the node refused this prompt"}]}).encode()])
        elif body.get("stream") is True:
            events = [f"data: {json.dumps({'response': w})}\n\n".encode()
                      for w in (text, " and", " more")] + [b"data: [DONE]\n\n"]
            await _send(send, 200, b"text/event-stream", events, self.gap_s)
        elif scope["path"].endswith("/v1/chat/completions"):
            await _send(send, 200, b"application/json", [json.dumps(
                {"id": f"chatcmpl-{self.calls}", "object": "chat.completion", "created": 1,
                 "model": MODEL, "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": text}}],
                 "usage": {"prompt_tokens": 3, "completion_tokens": 2,
                           "total_tokens": 5}}).encode()])
        else:
            await _send(send, 200, b"application/json", [json.dumps(
                {"result": {"response": text}, "success": True, "errors": [],
                 "messages": []}).encode()])


async def _send(send, status: int, content_type: bytes, chunks: list[bytes],
                gap_s: float = 0.0) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type)]})
    for i, chunk in enumerate(chunks):
        if i and gap_s:
            await asyncio.sleep(gap_s)
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
