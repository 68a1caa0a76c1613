"""A gateway and one edge node served inside the test process, on free loopback ports.

Both are uvicorn servers on threads of the test process, not subprocesses: the model loads once
into the process that runs the tests (the node's torch work runs on its own compute thread, as
in `edge-node start`), there is no child process to start, wait for or leave behind, and a
debugger or coverage sees the whole stack. Replaying needs no node: the gateway alone starts,
and since the gateway never imports torch, neither does the test run.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

# The account the fixtures' clients use. It is fixed, not random, because a request's key
# holds its URL and the URL holds the account: recordings made in one run replay in the next.
TEST_ACCOUNT = "edfe" * 8
CITY = "fra"
_START_TIMEOUT_S = 60.0
_NODE_TIMEOUT_S = 600.0  # a first load may build the native kernels (minutes on 2 cores)


@dataclass(slots=True)
class Fleet:
    """What the fixtures hand out: where the gateway is, its account and token, and how the
    fleet was started. `node_url` is None when replaying (no node runs)."""

    url: str
    account_id: str
    token: str
    node_url: str | None
    record_dir: Path | None
    replay_dir: Path | None
    node_secret: str
    warm: set[str] = field(default_factory=set)

    @property
    def openai_base_url(self) -> str:
        return f"{self.url}/client/v4/accounts/{self.account_id}/ai/v1"

    def ensure_models(self, models: list[str]) -> None:
        """Load each model on the node (once per session) before a test uses it. Warm-up calls
        go to the node directly, so a recording holds only the tests' own requests."""
        if self.node_url is None:
            return
        from edgefire.contract.catalog import Catalog
        from edgefire.contract.headers import NODE_SECRET
        from edgefire.contract.schemas import TEXT_EMBEDDINGS

        catalog = Catalog.load()
        for model in models:
            if model in self.warm:
                continue
            spec = catalog.get_runnable(model)  # a typo or planning-only model fails here
            inputs = ({"text": "warm-up"} if spec.task == TEXT_EMBEDDINGS
                      else {"prompt": "warm-up", "max_tokens": 1})
            response = httpx.post(
                f"{self.node_url}/client/v4/accounts/{self.account_id}/ai/run/{spec.id}",
                json=inputs, headers={NODE_SECRET: self.node_secret}, timeout=_NODE_TIMEOUT_S,
                trust_env=False)
            if response.status_code != 200:
                raise RuntimeError(f"edgefire: loading {model} failed: {response.text}")
            self.warm.add(model)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def served(app: object, port: int) -> Iterator[str]:
    """app (ASGI) served by uvicorn in a thread on 127.0.0.1:port until the block ends."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name=f"edgefire-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + _START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"edgefire: the server on port {port} did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)


@contextlib.contextmanager
def in_process_fleet(record_dir: Path | None = None, replay_dir: Path | None = None,
                     replay_speed: float | None = None) -> Iterator[Fleet]:
    """A gateway (in-memory database, the fixed test account) and, unless replaying, an edge
    node for Frankfurt that has registered with it."""
    from edgefire.gateway.app import create_app
    from edgefire.gateway.db import Database
    from edgefire.gateway.dev import apply_dev_defaults
    from edgefire.gateway.settings import GatewaySettings
    from edgefire.gateway.state import GatewayState

    port, secret = free_port(), secrets.token_urlsafe(24)
    overrides: dict = {"gateway_config": None, "redis_url": None, "node_secret": secret,
                       "heartbeat_timeout_s": 5.0}
    if record_dir is not None:
        overrides["record_dir"] = record_dir
    if replay_dir is not None:
        overrides["replay_dir"] = replay_dir
    if replay_speed is not None:
        overrides["replay_speed"] = replay_speed
    settings = GatewaySettings(**overrides)  # EDGEFIRE_* from the environment fill the rest
    # As `edge-gateway dev`: stand-in models (code written for Llama 3.1 8B runs on SmolLM2)
    # and x-edgefire-fault, so tests can exercise retry and fallback code.
    apply_dev_defaults(settings)
    state = GatewayState.build(settings, db=Database(":memory:"))
    state.accounts.create_account("edgefire tests", TEST_ACCOUNT)
    _, token = state.accounts.create_token(TEST_ACCOUNT, "pytest")
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(served(create_app(state), port))
        node_url = None
        if settings.replay_dir is None:
            node_url = stack.enter_context(_node(url, secret))
            deadline = time.monotonic() + _NODE_TIMEOUT_S
            while not state.directory.healthy():
                if time.monotonic() > deadline:
                    raise RuntimeError("edgefire: the edge node did not register in time")
                time.sleep(0.05)
        yield Fleet(url, TEST_ACCOUNT, token, node_url, settings.record_dir, settings.replay_dir,
                    secret)


@contextlib.contextmanager
def _node(gateway_url: str, secret: str) -> Iterator[str]:
    """The node, imported only here: torch loads when a node is really started."""
    from edgefire.contract.cities import load_city
    from edgefire.runtime.node.node import EdgeNode
    from edgefire.runtime.node.settings import NodeSettings
    from edgefire.runtime.server.app import create_app

    port = free_port()
    settings = NodeSettings(gateway_url=gateway_url, public_url=f"http://127.0.0.1:{port}",
                            node_secret=secret, heartbeat_interval_s=0.5)
    with served(create_app(EdgeNode(load_city(CITY), settings)), port) as url:
        yield url
