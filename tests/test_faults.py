"""Faults over real HTTP: a gateway in front of two real edge node processes (Frankfurt and
Singapore), one of which is killed (SIGKILL) while it answers.

A non-streamed request is retried on the other node and succeeds. A stream cannot be retried
once its first event is out: it must end with one clean error event in the envelope its route
speaks, and a properly closed body, rather than a connection dropped mid-event.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from edgefire.gateway.app import create_app
from edgefire.gateway.db import Database
from edgefire.gateway.settings import GatewaySettings
from edgefire.gateway.state import GatewayState
from tests.conftest import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SMOL = "@cf/huggingfacetb/smollm2-135m-instruct"
SECRET = "fault-test-node-secret"
GEO = {"fra": "50.11,8.68", "sin": "1.35,103.82"}  # x-client-geo: the nearest node first
LONG = {"prompt": "Count from 1 to 500, separated by commas.", "max_tokens": 96,
        "temperature": 0}


class Fleet:
    def __init__(self, gateway_url: str, state: GatewayState) -> None:
        self.gateway_url = gateway_url
        self.state = state
        self.nodes: dict[str, tuple[subprocess.Popen, str]] = {}
        account = state.accounts.create_account("faults")
        _, token = state.accounts.create_token(account.id)
        self.account = account.id
        self.http = httpx.Client(base_url=gateway_url, timeout=120, trust_env=False,
                                 headers={"authorization": f"Bearer {token}"})

    def start(self, city: str) -> None:
        port = free_port()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "EDGEFIRE_GATEWAY_URL": self.gateway_url,
               "EDGEFIRE_NODE_SECRET": SECRET, "EDGEFIRE_HEARTBEAT_INTERVAL_S": "0.3",
               "EDGEFIRE_KV_CACHE_MIB": "64"}
        env.pop("EDGEFIRE_PUBLIC_URL", None)  # the node must advertise the port it serves
        proc = subprocess.Popen([sys.executable, "-m", "edgefire.edge_nodes.cli", "start", "--city",
                                 city, "--port", str(port)], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        self.nodes[city] = (proc, url)
        deadline = time.monotonic() + 120
        # The directory may still hold the node this one replaces, healthy for a moment.
        while (city, url) not in {(n.city, n.url) for n in self.state.directory.healthy()}:
            assert proc.poll() is None, f"node {city} exited with {proc.returncode}"
            assert time.monotonic() < deadline, f"node {city} did not register"
            time.sleep(0.1)
        # Load the model there now, so the test's own requests do not wait for a cold load.
        assert self.run(city, {"prompt": "Hi", "max_tokens": 1}).status_code == 200

    def alive(self, city: str) -> bool:
        return city in self.nodes and self.nodes[city][0].poll() is None

    def kill(self, city: str) -> None:
        proc, _ = self.nodes[city]
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def kill_when_generating(self, city: str) -> None:
        """SIGKILL city's node as soon as its engine is running a request."""
        url = self.nodes[city][1] + "/metrics"
        deadline = time.monotonic() + 60
        while not _running(httpx.get(url, timeout=5, trust_env=False).text):
            assert time.monotonic() < deadline, f"{city} never started generating"
            time.sleep(0.01)
        self.kill(city)

    def run(self, city: str, body: dict) -> httpx.Response:
        return self.http.post(f"/v1/{self.account}/default/workers-ai/{SMOL}", json=body,
                              headers={"x-client-geo": GEO[city]})

    def close(self) -> None:
        for proc, _ in self.nodes.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.http.close()


def _running(metrics: str) -> bool:
    return any(line.startswith("edgefire_requests_running{") and float(line.split()[-1]) >= 1
               for line in metrics.splitlines())


@pytest.fixture(scope="module")
def _fleet(serve):
    settings = GatewaySettings(node_secret=SECRET, heartbeat_timeout_s=2.0)
    state = GatewayState.build(settings, db=Database(":memory:"))
    port = free_port()
    with serve(create_app(state), port) as url:
        fleet = Fleet(url, state)
        try:
            yield fleet
        finally:
            fleet.close()


@pytest.fixture
def fleet(_fleet):
    """Both nodes up and registered: a test that killed one leaves it to be started again."""
    for city in ("fra", "sin"):
        if not _fleet.alive(city):
            _fleet.start(city)
    return _fleet


def test_a_request_whose_node_is_killed_is_retried_on_the_other_node(fleet):
    answer: dict[str, httpx.Response] = {}
    request = threading.Thread(target=lambda: answer.update(response=fleet.run("fra", LONG)))
    request.start()
    fleet.kill_when_generating("fra")
    request.join(timeout=120)
    response = answer["response"]
    assert response.status_code == 200, response.text
    assert response.json()["result"]["response"]
    record = fleet.state.logs.get(fleet.account, "default", response.headers["cf-aig-log-id"])
    assert record.node == "sin"  # fra died before it answered; sin answered in full


@pytest.mark.parametrize("route", ["run", "openai"])
def test_a_stream_whose_node_is_killed_ends_with_an_error_event(fleet, route):
    if route == "run":
        path, body = f"/client/v4/accounts/{fleet.account}/ai/run/{SMOL}", LONG
    else:
        path = f"/client/v4/accounts/{fleet.account}/ai/v1/chat/completions"
        body = {"model": SMOL, "messages": [{"role": "user", "content": LONG["prompt"]}],
                "max_tokens": 96, "temperature": 0}
    with fleet.http.stream("POST", path, json={**body, "stream": True},
                           headers={"x-client-geo": GEO["sin"]}) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        fleet.kill("sin")
        rest = [line for line in lines if line.startswith("data: ")]  # must not raise
    events = [json.loads(line[6:]) for line in [first, *rest]]  # every event whole
    assert "data: [DONE]" not in rest
    error, answers = events[-1], events[:-1]
    assert answers and all("error" not in e and "errors" not in e for e in answers)
    if route == "run":
        assert error["success"] is False and error["result"] is None
        assert error["errors"][0]["code"] == 3040
        assert "mid-stream" in error["errors"][0]["message"]
    else:
        assert error["error"]["code"] == "3040" and "mid-stream" in error["error"]["message"]
