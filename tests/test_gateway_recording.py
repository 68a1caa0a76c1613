"""Record/replay over real HTTP: a gateway records what a stand-in node's answers looked like to
the client; a second gateway, with no node at all, replays them byte for byte."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from edgefire import AI
from edgefire.contract.errors import ConfigError, ReplayMissError
from edgefire.gateway.app import create_app
from edgefire.gateway.db import Database
from edgefire.gateway.settings import GatewaySettings
from edgefire.gateway.state import GatewayState
from tests.conftest import free_port
from tests.gateway_fakes import MODEL, CountingNode, heartbeat

ACCOUNT = "0123456789abcdef0123456789abcdef"  # the same account records and replays
RUN = f"/client/v4/accounts/{ACCOUNT}/ai/run/{MODEL}"
CHAT = f"/client/v4/accounts/{ACCOUNT}/ai/v1/chat/completions"
PROVIDER = f"/v1/{ACCOUNT}/default/workers-ai/{MODEL}"
COMPAT = f"/v1/{ACCOUNT}/default/compat/chat/completions"
UNIVERSAL = f"/v1/{ACCOUNT}/default"


@dataclass(slots=True)
class Seen:
    status: int
    headers: dict[str, str]
    chunks: list[bytes]  # as they came off the connection
    seconds: float

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


def call(client: httpx.Client, path: str, body: dict | list, **headers: str) -> Seen:
    began = time.monotonic()
    with client.stream("POST", path, json=body, headers=headers) as response:
        chunks = list(response.iter_raw())
    # date and server are the HTTP server's, set on every answer; the rest is the app's.
    kept = {k: v for k, v in response.headers.items() if k not in ("date", "server")}
    return Seen(response.status_code, kept, chunks, time.monotonic() - began)


@contextlib.contextmanager
def gateway(serve, **settings) -> Iterator[httpx.Client]:
    state = GatewayState.build(GatewaySettings(redis_url=None, gateway_config=None,
                                               heartbeat_timeout_s=3600, **settings),
                               db=Database(":memory:"))
    state.accounts.create_account("tests", ACCOUNT)
    _, token = state.accounts.create_token(ACCOUNT)  # a new token each time
    with serve(create_app(state)) as url, httpx.Client(
            base_url=url, timeout=30, headers={"authorization": f"Bearer {token}"}) as client:
        yield client


# What the suite sends, in order; the first is sent twice and the node answers it differently.
CALLS = [
    (RUN, {"prompt": "Hi"}, {}),
    (RUN, {"prompt": "Hi"}, {}),
    (RUN, {"prompt": "Hi", "stream": True}, {}),
    (CHAT, {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}, {}),
    (PROVIDER, {"prompt": "Hi"}, {"cf-aig-metadata": '{"suite":"replay"}',
                                  "x-edgefire-node-secret": "not-for-files"}),
    (RUN, {"prompt": "fail"}, {}),
    (COMPAT, {"model": f"workers-ai/{MODEL}", "messages": [{"role": "user", "content": "Hi"}]},
     {}),
    (UNIVERSAL, [{"provider": "workers-ai", "endpoint": MODEL, "headers": {},
                  "query": {"prompt": "Hi there"}}], {}),
]


@pytest.fixture(scope="module")
def recorded(serve, tmp_path_factory) -> tuple[Path, list[Seen]]:
    folder = tmp_path_factory.mktemp("recordings")
    with serve(CountingNode(gap_s=0.25)) as node, gateway(serve, record_dir=folder) as client:
        client.post("/internal/nodes/heartbeat", json=heartbeat(node)).raise_for_status()
        return folder, [call(client, path, body, **headers) for path, body, headers in CALLS]


def test_recording_holds_what_the_node_answered(recorded) -> None:
    folder, seen = recorded
    assert [s.status for s in seen] == [200, 200, 200, 200, 200, 400, 200, 200]
    assert json.loads(seen[0].body)["result"]["response"] == "answer 1"
    assert json.loads(seen[1].body)["result"]["response"] == "answer 2"
    assert len(seen[2].chunks) == 4, "the stream's events came as separate chunks"
    files = sorted(folder.glob("*.json"))
    assert len(files) == 7  # one per distinct request
    documents = [json.loads(f.read_text()) for f in files]
    repeated = next(d for d in documents if d["request"]["body"] == {"prompt": "Hi"}
                    and d["request"]["path"] == RUN)
    assert len(repeated["responses"]) == 2
    for document in documents:  # no credential is written down
        assert "authorization" not in json.dumps(document["request"]).lower()
        assert "not-for-files" not in json.dumps(document)
    provider = next(d for d in documents if d["request"]["path"] == PROVIDER)
    assert provider["request"]["headers"] == {"cf-aig-metadata": '{"suite":"replay"}'}


def test_replay_is_byte_exact_with_no_node(serve, recorded) -> None:
    folder, seen = recorded
    with gateway(serve, replay_dir=folder) as client:
        replayed = [call(client, path, body, **headers) for path, body, headers in CALLS]
        exhausted = call(client, RUN, {"prompt": "Hi"})
    for before, after in zip(seen, replayed, strict=True):
        assert after.status == before.status
        assert after.headers == before.headers
        assert after.body == before.body
    stream_before, stream_after = seen[2], replayed[2]
    assert stream_after.chunks == stream_before.chunks  # same boundaries, same bytes
    assert stream_after.seconds >= 0.9 * 3 * 0.25, "replayed with the recorded timing"
    # Repeated requests come back in recorded order; then the policy (error by default).
    assert [json.loads(r.body)["result"]["response"] for r in replayed[:2]] == \
        ["answer 1", "answer 2"]
    assert json.loads(replayed[5].body)["errors"][0]["code"] == 5006  # a recorded error
    assert exhausted.status == 404
    error = json.loads(exhausted.body)["errors"][0]
    assert error["code"] == ReplayMissError.code
    assert "recorded 2 time(s) and this is call 3" in error["message"]


def test_replay_miss_names_the_nearest_recording(serve, recorded) -> None:
    folder, _ = recorded
    with gateway(serve, replay_dir=folder) as client:
        miss = call(client, RUN, {"prompt": "Hello"})
        openai_miss = call(client, CHAT, {"model": MODEL,
                                          "messages": [{"role": "user", "content": "Yo"}]})
        stranger = client.post(RUN, json={"prompt": "Hi"},
                               headers={"authorization": "Bearer not-a-token"})
    assert miss.status == 404
    message = json.loads(miss.body)["errors"][0]["message"]
    assert message.startswith(f"No recording matches this request (POST {RUN})")
    assert 'body.prompt: recorded "Hi", sent "Hello"' in message
    error = json.loads(openai_miss.body)["error"]  # the OpenAI route's own error shape
    assert error["code"] == str(ReplayMissError.code)
    assert 'body.messages[0].content: recorded "Hi", sent "Yo"' in error["message"]
    assert stranger.status_code == 401  # the token is not in the key, but still checked


def test_replay_speed_and_cycle_policy(serve, recorded) -> None:
    folder, seen = recorded
    with gateway(serve, replay_dir=folder, replay_speed=0, replay_exhausted="cycle") as client:
        answers = [call(client, RUN, {"prompt": "Hi"}) for _ in range(3)]
        stream = call(client, RUN, {"prompt": "Hi", "stream": True})
    assert [a.body for a in answers] == [seen[0].body, seen[1].body, seen[0].body]
    assert stream.body == seen[2].body
    assert stream.seconds < 0.25, "speed 0 does not wait"


def test_record_and_replay_are_exclusive(tmp_path) -> None:
    settings = GatewaySettings(redis_url=None, gateway_config=None, record_dir=tmp_path,
                               replay_dir=tmp_path)
    state = GatewayState.build(settings, db=Database(":memory:"))
    with pytest.raises(ConfigError, match="exclusive"):
        create_app(state)


def test_unreadable_recording_refuses_to_start(tmp_path) -> None:
    (tmp_path / "broken.json").write_text("{not json")
    state = GatewayState.build(GatewaySettings(redis_url=None, gateway_config=None,
                                               replay_dir=tmp_path), db=Database(":memory:"))
    with pytest.raises(ConfigError, match="broken.json cannot be read"):
        create_app(state)


def test_a_stream_the_client_left_early_is_recorded_as_received(serve, tmp_path) -> None:
    # The binding stops reading at `[DONE]` and hangs up, so the gateway never sends the end
    # of the stream; the recording must still hold what the client was sent.
    body = {"prompt": "cut", "stream": True}
    with serve(CountingNode(gap_s=0.25)) as node, gateway(serve, record_dir=tmp_path) as client:
        client.post("/internal/nodes/heartbeat", json=heartbeat(node)).raise_for_status()
        with client.stream("POST", RUN, json=body) as response:
            first = next(response.iter_raw())
        deadline = time.monotonic() + 10
        while not list(tmp_path.glob("*.json")):
            assert time.monotonic() < deadline, "the cut stream was not recorded"
            time.sleep(0.05)
    chunks = json.loads(next(tmp_path.glob("*.json")).read_text())["responses"][0]["chunks"]
    assert 1 <= len(chunks) < 4 and chunks[0]["text"].encode() == first
    with gateway(serve, replay_dir=tmp_path, replay_speed=0) as client:
        replayed = call(client, RUN, body)
    assert replayed.status == 200 and replayed.body.startswith(first)
    assert replayed.body == b"".join(c["text"].encode() for c in chunks)


def test_every_stream_the_binding_reads_to_done_is_recorded(serve, tmp_path) -> None:
    # The binding hangs up as soon as it has `[DONE]`, racing the gateway's last write; each
    # of these streams must still be recorded (a cancelled write once lost about one in six).
    with serve(CountingNode(gap_s=0.0)) as node, gateway(serve, record_dir=tmp_path) as client:
        client.post("/internal/nodes/heartbeat", json=heartbeat(node)).raise_for_status()
        token = client.headers["authorization"].removeprefix("Bearer ")

        async def stream_all() -> list[list[dict]]:
            http = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0))
            async with AI(str(client.base_url), ACCOUNT, token, http=http) as ai:
                return [[event async for event in await ai.run(
                    MODEL, {"prompt": f"p{i}", "stream": True})] for i in range(40)]

        answers = asyncio.run(stream_all())
        await_files = time.monotonic() + 10
        while len(list(tmp_path.glob("*.json"))) < 40 and time.monotonic() < await_files:
            time.sleep(0.05)
    assert len(list(tmp_path.glob("*.json"))) == 40
    with gateway(serve, replay_dir=tmp_path, replay_speed=0) as client:
        replayed = call(client, RUN, {"prompt": "p7", "stream": True})
    assert answers[7][0] == {"response": "answer 8"}
    assert replayed.body.startswith(b'data: {"response": "answer 8"}\n\n')


def test_the_dev_fleet_replaying_starts_no_node(tmp_path) -> None:
    (tmp_path / "recordings").mkdir()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEFIRE_")}
    env["EDGEFIRE_REPLAY_DIR"] = str(tmp_path / "recordings")
    dev = subprocess.Popen([sys.executable, "-m", "edgefire.gateway.cli", "dev", "--port",
                            str(port)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline and dev.poll() is None, "the gateway did not start"
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{base}/health", timeout=1).status_code:
                    break
            time.sleep(0.1)
        assert psutil.Process(dev.pid).children(recursive=True) == []  # no node process
        account = json.loads((tmp_path / ".edgefire" / "dev.json").read_text())
        answer = httpx.post(f"{base}/client/v4/accounts/{account['account_id']}/ai/run/{MODEL}",
                            json={"prompt": "Hi"}, timeout=10,
                            headers={"authorization": f"Bearer {account['token']}"})
    finally:
        dev.send_signal(signal.SIGINT)
        output = dev.communicate(timeout=30)[0]
    assert answer.status_code == 404, output
    error = answer.json()["errors"][0]
    assert error["code"] == 5090 and "holds no recordings" in error["message"]
    assert "waiting for edge node" not in output
