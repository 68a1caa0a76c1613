"""A stand-in upstream (edge node or OpenAI-compatible API) that records what reached it, and
a gateway served over real HTTP in front of it, for the gateway's security tests."""

from __future__ import annotations

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
        raw, more = b"", True
        while more:
            message = await receive()
            raw += message.get("body", b"")
            more = message.get("more_body", False)
        body = json.loads(raw) if raw else {}
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
