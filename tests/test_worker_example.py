"""examples/worker run for real: its npm packages installed, a private `make run` fleet, and the
Worker under `wrangler dev --env offline` (the plugin's external service) and under
Miniflare's JS API (remoteProxyConnectionString). Each way: a SmolLM2 answer, a stream, an AI
Gateway cache HIT seen in the gateway's log, and a bad input and an injected fault thrown as
InferenceUpstreamError with their codes. And the Worker answering from recordings (made
through Miniflare against a fake node) by a gateway with no node.
Needs Node 20+ and npm (the npm registry once; later runs reuse node_modules)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.soak_fleet import Fleet, free_port, private_fleet
from tests.gateway_fakes import gateway, heartbeat
from tests.test_binding_protocol import SECRET, SSE, FakeNode

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "worker"
STAMP = EXAMPLE / "node_modules" / ".edgefire-lock-sha256"
MODEL_NAME = "@cf/huggingfacetb/smollm2-135m-instruct"

pytestmark = pytest.mark.slow


def _lock_digest() -> str:
    files = (EXAMPLE / "package.json", EXAMPLE / "package-lock.json",
             EXAMPLE / "edgefire-wrangler-plugin" / "package.json")
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()


@pytest.fixture(scope="module")
def installed() -> Path:
    """`npm ci` unless node_modules already holds this package-lock's install."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is not on PATH: the Worker example needs Node.js 20+ with npm")
    digest = _lock_digest()
    if not (STAMP.is_file() and STAMP.read_text() == digest):
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=EXAMPLE,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"npm ci failed:\n{done.stdout}\n{done.stderr}"
        STAMP.write_text(digest)
    return EXAMPLE / "node_modules" / ".bin"


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with private_fleet("fra") as running:
        yield running


def _env(gateway_url: str, token: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "EDGEFIRE_API_TOKEN"}
    env |= {"EDGEFIRE_GATEWAY_URL": gateway_url,
            # Offline: no request.cf download, no telemetry.
            "CLOUDFLARE_CF_FETCH_ENABLED": "false", "WRANGLER_SEND_METRICS": "false"}
    if token is not None:
        env["EDGEFIRE_API_TOKEN"] = token
    return env


@contextlib.contextmanager
def wrangler_dev(bin_dir: Path, env: dict[str, str], log: Path) -> Iterator[str]:
    """`wrangler dev --env offline` on free ports; its base URL once it answers."""
    port = free_port()
    cmd = [str(bin_dir / "wrangler"), "dev", "--env", "offline", "--ip", "127.0.0.1",
           "--port", str(port), "--inspector-port", str(free_port())]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=EXAMPLE, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"wrangler dev exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"wrangler dev did not start:\n{log.read_text()}"
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"{url}/no-such-route", timeout=5)
                break
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # wrangler and the workerd it started
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _miniflare(gateway_url: str, paths: list[str]) -> list[tuple[int, str | None, str]]:
    """examples/worker/miniflare.mjs: (status, content type, body) per path, in order."""
    done = subprocess.run(["node", "miniflare.mjs", *paths], cwd=EXAMPLE, env=_env(gateway_url),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [line["path"] for line in lines] == paths, done.stdout + done.stderr
    return [(line["status"], line["contentType"], line["body"]) for line in lines]


def _paths(tag: str) -> dict[str, str]:
    # A prompt of its own per way, so the first cached call is a MISS whatever ran before.
    prompt = f"Name a colour. ({tag} {uuid.uuid4().hex[:8]})"
    return {"plain": "/?max_tokens=8", "stream": "/stream?max_tokens=8",
            "cached": f"/cached?max_tokens=8&prompt={prompt}", "error": "/error",
            "fault": "/error?fault=capacity", "models": "/models?search=smollm2"}


def _check(answers: dict[str, tuple[int, str | None, str]],
           second_cached: tuple[int, str | None, str]) -> None:
    """answers: route → (status, content type, body) through the Worker; second_cached: the
    cached route's second call."""
    status, kind, body = answers["plain"]
    assert status == 200 and kind == "application/json", body
    plain = json.loads(body)
    assert isinstance(plain["answer"]["response"], str) and plain["answer"]["response"].strip()
    assert 0 < plain["answer"]["usage"]["completion_tokens"] <= 8 and plain["requestId"]

    status, kind, body = answers["stream"]
    assert status == 200 and kind == "text/event-stream", body
    events = [line.removeprefix("data: ") for line in body.split("\n\n") if line]
    assert events[-1] == "[DONE]", body
    assert "".join(json.loads(e)["response"] for e in events[:-1]).strip(), body

    first, second = json.loads(answers["cached"][2]), json.loads(second_cached[2])
    assert (first["cached"], second["cached"]) == (False, True), (first, second)
    assert first["answer"] == second["answer"] and first["logId"] != second["logId"]
    assert json.loads(second["metadata"]) == {"route": "cached"}

    status, _, body = answers["error"]
    assert status == 400 and json.loads(body)["name"] == "InferenceUpstreamError", body
    assert json.loads(body)["message"].startswith("5006: "), body
    status, _, body = answers["fault"]  # make run's fleet has fault injection on
    assert status == 400 and json.loads(body)["message"].startswith("3040: "), body

    status, _, body = answers["models"]
    assert status == 200 and MODEL_NAME in json.loads(body), body


def test_the_worker_under_wrangler_dev(installed, fleet, tmp_path):
    paths = _paths("wrangler")
    with wrangler_dev(installed, _env(fleet.gateway_url), tmp_path / "wrangler.log") as url, \
            httpx.Client(base_url=url, timeout=180) as worker:
        answers = {}
        for name, path in paths.items():
            response = worker.get(path)
            answers[name] = (response.status_code, response.headers.get("content-type"),
                             response.text)
        again = worker.get(paths["cached"])
        _check(answers, (again.status_code, None, again.text))


def test_the_plugin_sends_its_token_with_every_call(installed, fleet, tmp_path):
    """injectRequestHeaders reaches the gateway: an unknown token is refused (10000) although
    this machine's calls would otherwise be served as the dev account."""
    env = _env(fleet.gateway_url, token="ef_not-a-real-token")
    with wrangler_dev(installed, env, tmp_path / "wrangler.log") as url:
        refused = httpx.get(f"{url}/error", timeout=60).json()
    assert refused["name"] == "InferenceUpstreamError"
    assert refused["message"].startswith("10000: Authentication error"), refused


def test_the_worker_under_miniflare(installed, fleet):
    paths = _paths("miniflare")
    answers = _miniflare(fleet.gateway_url, [*paths.values(), paths["cached"]])
    _check(dict(zip(paths, answers, strict=False)), answers[-1])


def test_the_worker_answers_from_recordings_with_no_node(installed, serve, tmp_path):
    """EDGEFIRE_RECORD_DIR, then EDGEFIRE_REPLAY_DIR: Miniflare's wrapped calls recorded against
    a fake node (no model: this is about the recordings) are answered by a gateway with none."""
    paths = ["/?max_tokens=8", "/stream?max_tokens=8", "/error"]
    node = FakeNode()
    with serve(node) as node_url, gateway(serve, tmp_path, node_secret=SECRET,
                                          record_dir=tmp_path) as gw:
        gw.state.settings.binding_account = gw.account_id
        gw.beat(heartbeat(node_url), SECRET).raise_for_status()
        recorded = _miniflare(gw.url, paths)
    assert len(node.bodies) == 3
    with gateway(serve, tmp_path, replay_dir=tmp_path, replay_speed=0) as gw:
        gw.state.settings.binding_account = gw.account_id
        replayed = _miniflare(gw.url, [*paths, "/error?fault=capacity"])
    assert replayed[:3] == recorded
    assert json.loads(replayed[0][2])["answer"] == {"response": "answer 1"}
    assert replayed[1][2].encode() == b"".join(SSE)
    assert json.loads(replayed[2][2])["message"].startswith("5006: ")
    status, _, body = replayed[3]  # never recorded: thrown with the replay's code
    assert status == 400 and json.loads(body)["name"] == "InferenceUpstreamError", body
    assert json.loads(body)["message"].startswith(
        "5090: No recording matches this request (POST /run?version=3)"), body
