"""Gateway resources over real HTTP: the response cache's byte budget and fairness, and Redis
faults (unreachable, silent, stopped mid-run) that degrade requests instead of failing them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest
import redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bench.gateway import MODEL, heartbeat
from edgefire.gateway.app import create_app
from edgefire.gateway.db import Database
from edgefire.gateway.redis_link import (
    COOLDOWN_S,
    FAULT_LOG_INTERVAL_S,
    RedisGuard,
    RedisUnavailable,
)
from edgefire.gateway.settings import GatewaySettings
from edgefire.gateway.state import GatewayState
from tests.conftest import free_port
from tests.redis_support import FakeClock

REDIS_SERVER = shutil.which("redis-server")
CACHED = {"cf-aig-cache-ttl": "60"}


def sized_node_app(seen: list[dict]) -> Starlette:
    """An edge node stand-in whose answer's `response` is `answer_bytes` long (default 2)."""

    async def run(request: Request) -> Response:
        body = await request.json()
        seen.append(body)
        text = "x" * body.get("answer_bytes", 2)
        return JSONResponse({"result": {"response": text}, "success": True, "errors": [],
                             "messages": []})

    return Starlette(routes=[
        Route("/client/v4/accounts/{account_id}/ai/run/{model:path}", run, methods=["POST"])])


@dataclass(slots=True)
class Gateway:
    base_url: str
    state: GatewayState
    accounts: dict[str, tuple[str, str]]  # name: (account id, token)
    seen: list[dict]  # bodies that reached the node

    def client(self, who: str = "a") -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=30,
                            headers={"authorization": f"Bearer {self.accounts[who][1]}"})

    def run(self, who: str = "a", gateway: str = "default", headers: dict | None = None,
            **body) -> httpx.Response:
        """A Workers AI request through `gateway`; `body` extends {"prompt": "hi"}."""
        with self.client(who) as client:
            return client.post(f"/v1/{self.accounts[who][0]}/{gateway}/workers-ai/{MODEL}",
                               json={"prompt": "hi", **body}, headers=headers or {})

    def create_gateway(self, gateway_id: str, who: str = "a", **fields) -> None:
        with self.client(who) as client:
            client.post(f"/client/v4/accounts/{self.accounts[who][0]}/ai-gateway/gateways",
                        json={"id": gateway_id, **fields}).raise_for_status()

    def health(self) -> dict:
        response = httpx.get(f"{self.base_url}/health", timeout=30)
        assert response.status_code == 200
        return response.json()

    def wait_for(self, what: str, check: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 15
        while not check():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)


@pytest.fixture
def start_gateway(serve) -> Iterator[Callable[..., Gateway]]:
    """`start_gateway(**settings)`: a gateway with accounts a and b in front of a stand-in node."""
    with contextlib.ExitStack() as stack:
        def start(**settings) -> Gateway:
            state = GatewayState.build(
                GatewaySettings(heartbeat_timeout_s=3600, node_secret=None, gateway_config=None,
                                **settings), db=Database(":memory:"))
            accounts = {}
            for name in ("a", "b"):
                account_id = state.accounts.create_account(name).id
                accounts[name] = (account_id, state.accounts.create_token(account_id)[1])
            seen: list[dict] = []
            node = stack.enter_context(serve(sized_node_app(seen)))
            base_url = stack.enter_context(serve(create_app(state)))
            httpx.post(f"{base_url}/internal/nodes/heartbeat",
                       json=heartbeat(node)).raise_for_status()
            return Gateway(base_url, state, accounts, seen)

        yield start


# -- the in-memory cache's budget ------------------------------------------------------------

def test_cache_holds_a_byte_budget_shared_fairly_and_skips_oversized_answers(start_gateway):
    budget = 64 << 10
    gw = start_gateway(redis_url=None, cache_max_bytes=budget, cache_max_entry_bytes=16 << 10)
    for i in range(2):
        assert gw.run("b", headers=CACHED, n=i).headers["cf-aig-cache-status"] == "MISS"
    # Account a floods the cache with answers of 10 kB: each fits, all of them do not.
    for i in range(40):
        response = gw.run("a", headers=CACHED, n=i, answer_bytes=10_000)
        assert response.status_code == 200 and response.headers["cf-aig-cache-status"] == "MISS"
    sent = len(gw.seen)
    for i in range(2):  # b's entries survived the flood
        assert gw.run("b", headers=CACHED, n=i).headers["cf-aig-cache-status"] == "HIT"
    assert gw.run("a", headers=CACHED, n=39, answer_bytes=10_000) \
        .headers["cf-aig-cache-status"] == "HIT"
    assert len(gw.seen) == sent
    # An answer over the entry cap is served but never stored.
    for _ in range(2):
        response = gw.run("a", headers=CACHED, answer_bytes=20_000)
        assert response.status_code == 200 and response.headers["cf-aig-cache-status"] == "MISS"
    assert len(gw.seen) == sent + 2
    assert gw.state.pipeline.cache.charged_bytes <= budget


# -- Redis faults ----------------------------------------------------------------------------

@contextlib.contextmanager
def silent_server() -> Iterator[str]:
    """A Redis URL whose server accepts connections (the kernel completes them up to the
    backlog) and never answers: nothing ever calls accept() or reads."""
    with socket.create_server(("127.0.0.1", 0), backlog=128) as listener:
        yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"


@contextlib.contextmanager
def closed_port() -> Iterator[str]:
    yield f"redis://127.0.0.1:{free_port()}/0"


def _assert_refused_closed(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    body = response.json()
    assert body["success"] is False and body["errors"][0]["code"] == 2003
    assert "Rate limit cannot be checked" in body["errors"][0]["message"]


@pytest.mark.parametrize("policy", ["open", "closed"])
@pytest.mark.parametrize("fault", [closed_port, silent_server], ids=["unreachable", "silent"])
def test_a_failing_redis_reads_as_a_cache_miss_and_limits_follow_the_setting(
        start_gateway, fault, policy):
    with fault() as url:
        gw = start_gateway(redis_url=url, redis_timeout_s=0.25, rate_limit_on_redis_error=policy)
        gw.create_gateway("limited", rate_limiting_limit=100, rate_limiting_interval=60)
        for _ in range(2):  # no rate limit on "default": served, cache misses
            response = gw.run(headers=CACHED)
            assert response.status_code == 200, response.text
            assert response.headers["cf-aig-cache-status"] == "MISS"
        assert len(gw.seen) == 2
        limited = gw.run(gateway="limited", headers=CACHED)
        if policy == "open":
            assert limited.status_code == 200, limited.text
            assert limited.headers["cf-aig-cache-status"] == "MISS"
        else:
            _assert_refused_closed(limited)
        health = gw.health()
        assert health["redis"] == "unreachable" and health["status"] == "degraded"


def test_health_says_redis_is_disabled_without_a_url(start_gateway):
    assert start_gateway(redis_url=None).health()["redis"] == "disabled"


class RedisProcess:
    """A private `redis-server` on its own port: no persistence, stopped and started at will."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._proc: subprocess.Popen | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while True:
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return
            assert self._proc.poll() is None, "redis-server exited"
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)

    def kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None


@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")
def test_redis_stopped_mid_run_degrades_then_recovers(start_gateway):
    redis_server = RedisProcess()
    redis_server.start()
    try:
        gw = start_gateway(redis_url=redis_server.url, redis_timeout_s=0.25,
                           rate_limit_on_redis_error="open")
        gw.create_gateway("limited", rate_limiting_limit=2, rate_limiting_interval=3600)
        assert gw.health()["redis"] == "ok"
        # Redis holds the cache and the limit.
        statuses = [gw.run(headers=CACHED).headers["cf-aig-cache-status"] for _ in range(2)]
        assert statuses == ["MISS", "HIT"]
        assert [gw.run(gateway="limited").status_code for _ in range(3)] == [200, 200, 429]

        redis_server.kill()
        response = gw.run(headers=CACHED)
        assert response.status_code == 200, response.text
        assert response.headers["cf-aig-cache-status"] == "MISS"
        assert gw.run(gateway="limited").status_code == 200  # fails open: the count is gone
        gw.wait_for("health to see Redis down", lambda: gw.health()["redis"] == "unreachable")

        redis_server.start()  # empty: nothing was saved
        gw.wait_for("health to see Redis back", lambda: gw.health()["redis"] == "ok")
        gw.wait_for("the cache to store and hit again",
                    lambda: gw.run(headers=CACHED).headers["cf-aig-cache-status"] == "HIT")
        gw.wait_for("the limit to count again",
                    lambda: gw.run(gateway="limited").status_code == 429)
    finally:
        redis_server.kill()


def test_redis_guard_cools_down_and_logs_a_fault_once_a_minute(caplog):
    clock = FakeClock(0.0)
    guard = RedisGuard("test user", clock=clock)
    calls: list[float] = []

    async def failing() -> None:
        calls.append(clock.now)
        raise redis.ConnectionError("refused")

    async def attempt_at(now: float) -> None:
        clock.now = now
        with pytest.raises(RedisUnavailable):
            await guard.run(failing)

    async def main() -> None:
        for now in (0.0, COOLDOWN_S / 2, COOLDOWN_S, 30.0, FAULT_LOG_INTERVAL_S):
            await attempt_at(now)

    with caplog.at_level(logging.WARNING, logger="edgefire.gateway.redis_link"):
        asyncio.run(main())
    assert calls == [0.0, COOLDOWN_S, 30.0, FAULT_LOG_INTERVAL_S]  # none while cooling down
    assert [r.getMessage().count("test user") for r in caplog.records] == [1, 1]
