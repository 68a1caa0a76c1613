"""The node's heartbeat to the gateway, over real HTTP."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from edgefire.contract.cities import load_city
from edgefire.gateway.routing.directory import NodeDirectory
from edgefire.runtime.node.heartbeat import HeartbeatSender
from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.node.settings import NodeSettings
from edgefire.runtime.server.app import create_app


def recording_gateway(beats: list[tuple[dict, dict]]) -> Starlette:
    async def heartbeat(request: Request) -> JSONResponse:
        beats.append((await request.json(), dict(request.headers)))
        return JSONResponse({"ok": True})

    return Starlette(routes=[Route("/internal/nodes/heartbeat", heartbeat, methods=["POST"])])


def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll until condition holds (the timeout only stops a broken test from hanging)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def free_port_url() -> str:
    # Bound and released: nothing listens there, so connections are refused.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_heartbeats_arrive_with_state_and_secret(serve) -> None:
    beats: list[tuple[dict, dict]] = []
    node = EdgeNode(load_city("fra"))

    with serve(recording_gateway(beats)) as gateway_url:
        sender = HeartbeatSender(node, gateway_url + "/", "http://fra.test:8701", 0.1, "s3cret")
        sender.start()
        wait_for(lambda: len(beats) >= 2)  # periodic: one at start, then every 0.1 s
        sender.stop()
        sender.stop()  # idempotent
    payload, headers = beats[0]
    city = node.city
    assert payload == {
        "city": "fra", "name": "Frankfurt", "url": "http://fra.test:8701",
        "lat": city.lat, "lon": city.lon, "role": "both",
        "memory_budget_bytes": city.memory_budget_bytes,
        "accelerator_bytes": city.declared_accelerator_bytes,
        "loaded_models": {}, "running": 0, "waiting": 0, "kv_usage": 0.0, "status": "ok",
        # The city's declared accelerators, which the gateway's placement plans on.
        "accelerators": {"kind": city.accelerators.kind, "count": city.accelerators.count},
    }
    assert headers["x-edgefire-node-secret"] == "s3cret"
    # What the node sends is what the gateway's directory accepts.
    state = NodeDirectory().heartbeat(payload)
    assert state.url == "http://fra.test:8701"
    assert state.accelerators == {"kind": "nvidia-h100", "count": 8}


def test_no_secret_header_without_a_secret(serve) -> None:
    beats: list[tuple[dict, dict]] = []

    with serve(recording_gateway(beats)) as gateway_url:
        sender = HeartbeatSender(EdgeNode(load_city("lhr")), gateway_url, "http://x", 0.1, None)
        sender.start()
        wait_for(lambda: len(beats) >= 2)
        sender.stop()
    assert beats and all("x-edgefire-node-secret" not in h for _, h in beats)


def test_dead_gateway_does_not_raise(caplog) -> None:
    with caplog.at_level("DEBUG", logger="edgefire.runtime.node.heartbeat"):
        sender = HeartbeatSender(EdgeNode(load_city("fra")), free_port_url(), "http://x", 0.05,
                                 None)
        sender.start()
        wait_for(lambda: len(caplog.records) >= 3)  # a warning, then debug lines
        assert sender.running
        sender.stop()
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1  # at most once a minute, however many beats failed


def test_node_app_heartbeats_when_a_gateway_is_configured(serve) -> None:
    beats: list[tuple[dict, dict]] = []
    with serve(recording_gateway(beats)) as gateway_url:
        settings = NodeSettings(gateway_url=gateway_url, heartbeat_interval_s=0.1,
                                node_secret="s3cret")
        with serve(create_app(EdgeNode(load_city("sin"), settings))):
            wait_for(lambda: bool(beats))
    payload, headers = beats[0]
    assert payload["city"] == "sin" and payload["url"] == "http://127.0.0.1:8704"
    assert headers["x-edgefire-node-secret"] == "s3cret"


def test_no_gateway_no_sender() -> None:
    node = EdgeNode(load_city("fra"), NodeSettings(gateway_url=None))
    assert HeartbeatSender.from_node(node) is None


def test_heartbeats_keep_arriving_while_the_event_loop_is_blocked(serve) -> None:
    # Regression: beats were sent from the node's event loop, so a loop stalled by a burst of
    # large requests stopped them and the gateway dropped a live node.
    beats: list[tuple[dict, dict]] = []
    node = EdgeNode(load_city("fra"))
    seen_while_blocked: list[int] = []

    async def main() -> None:
        sender = HeartbeatSender(node, gateway_url, "http://fra.test:8701", 0.05, None)
        sender.start()  # as the node app's lifespan does, from the loop
        try:
            before = len(beats)
            # Block this loop (no await) until three more beats came in.
            wait_for(lambda: len(beats) >= before + 3)
            seen_while_blocked.append(len(beats) - before)
        finally:
            await asyncio.to_thread(sender.stop)

    with serve(recording_gateway(beats)) as gateway_url:
        asyncio.run(main())
    assert seen_while_blocked and seen_while_blocked[0] >= 3


def test_payload_reports_degraded_while_a_model_is() -> None:
    node = EdgeNode(load_city("fra"))
    sender = HeartbeatSender(node, "http://gateway.test", "http://fra.test:8701", 1.0, None)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(node.registry, "degraded", lambda: ["@cf/some/model"])
        assert sender.report().status == "degraded"
    assert sender.report().status == "ok"

