"""`edge-gateway dev` start-up: the dev file's tokens, the banner only once the nodes are
ready, and requests held (then 503 "starting", never 429 "no data centers") until then."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from contextlib import closing

import httpx
import pytest

from edgefire.gateway.db import Database
from edgefire.gateway.dev import NodeExitedError, ensure_dev_account, serve_fleet, wait_for_fleet
from edgefire.gateway.routing.directory import NodeDirectory
from tests.gateway_fakes import MODEL, RecordingUpstream, gateway, heartbeat

SECRET = "s"


class FakeProcess:
    def __init__(self, returncode: int | None = None) -> None:
        self.returncode = returncode

    def poll(self) -> int | None:
        return self.returncode


class FakeServer:
    """uvicorn.Server's part that serve_fleet uses: serve() until should_exit."""

    should_exit = False

    async def serve(self) -> None:
        while not self.should_exit:
            await asyncio.sleep(0.01)


def test_the_dev_file_keeps_an_admin_token(tmp_path):
    dev_file = tmp_path / "dev.json"
    with closing(Database(":memory:")) as db:
        first = ensure_dev_account(db, dev_file)
        assert first["admin_token"] and first["admin_token"] != first["token"]
        assert ensure_dev_account(db, dev_file) == first
        assert dev_file.stat().st_mode & 0o777 == 0o600
        # A file written before there was an admin token keeps its account and gains one.
        dev_file.write_text(json.dumps({"account_id": first["account_id"],
                                        "token": first["token"]}))
        upgraded = ensure_dev_account(db, dev_file)
    assert upgraded["token"] == first["token"] and upgraded["admin_token"]
    assert json.loads(dev_file.read_text()) == upgraded


def test_the_dev_file_names_the_gateway_the_binding_calls(tmp_path):
    from edgefire import AI

    dev_file = tmp_path / "dev.json"
    with closing(Database(":memory:")) as db:
        first = ensure_dev_account(db, dev_file, "http://127.0.0.1:9999")
        moved = ensure_dev_account(db, dev_file, "http://127.0.0.1:9000")
    assert moved["token"] == first["token"] and moved["gateway_url"] == "http://127.0.0.1:9000"
    assert AI.from_dev_file(dev_file).base_url == "http://127.0.0.1:9000"
    assert AI.from_dev_file(dev_file, "http://other:1").base_url == "http://other:1"


def test_the_banner_waits_for_ready_nodes(capsys):
    directory = NodeDirectory()
    server = FakeServer()

    async def scenario() -> int:
        serving = asyncio.ensure_future(serve_fleet(server, directory, {"fra": FakeProcess()},
                                                    "http://gw", {"account_id": "a",
                                                                  "token": "t"}))
        directory.heartbeat(heartbeat("http://127.0.0.1:1", status="starting"))
        await asyncio.sleep(0.3)  # several polls: registered but starting is not ready
        assert "edgefire gateway on" not in capsys.readouterr().out
        directory.heartbeat(heartbeat("http://127.0.0.1:1"))
        for _ in range(100):
            await asyncio.sleep(0.05)
            if "edgefire gateway on http://gw" in capsys.readouterr().out:
                break
        else:
            pytest.fail("no banner once the node was ready")
        server.should_exit = True
        return await serving

    assert asyncio.run(scenario()) == 0


def test_a_node_that_dies_before_it_is_ready_stops_the_dev_fleet(capsys):
    code = asyncio.run(serve_fleet(FakeServer(), NodeDirectory(), {"fra": FakeProcess(3)},
                                   "http://gw", {}))
    assert code == 1 and "edge node fra exited with code 3" in capsys.readouterr().err
    with pytest.raises(NodeExitedError):
        asyncio.run(wait_for_fleet(NodeDirectory(), {"fra": FakeProcess(3)}))


def _run(gw, results: list) -> None:
    with gw.client() as client:
        results.append(client.post(f"/client/v4/accounts/{gw.account_id}/ai/run/{MODEL}",
                                   json={"prompt": "hi"}))


def test_a_request_before_the_first_node_is_held_until_it_registers(serve, tmp_path):
    node = RecordingUpstream()
    with serve(node) as node_url, \
            gateway(serve, tmp_path, node_secret=SECRET, startup_hold_s=30) as gw:
        results: list[httpx.Response] = []
        early = threading.Thread(target=_run, args=(gw, results))
        early.start()
        time.sleep(0.3)  # the request is in the gateway, with no node yet
        gw.beat(heartbeat(node_url), SECRET).raise_for_status()
        early.join(timeout=30)
        assert results[0].status_code == 200, results[0].text
        assert len(node.seen) == 1


def test_with_no_node_in_time_the_answer_is_503_starting_not_429(serve, tmp_path):
    with gateway(serve, tmp_path, node_secret=SECRET, startup_hold_s=0.2) as gw:
        results: list[httpx.Response] = []
        _run(gw, results)
        starting = results[0]
        assert starting.status_code == 503, starting.text
        error = starting.json()["errors"][0]
        assert error["code"] == 3040 and "starting" in error["message"]


def test_after_start_up_a_fleet_without_nodes_answers_at_once(serve, tmp_path):
    with gateway(serve, tmp_path, node_secret=SECRET, startup_hold_s=30) as gw:
        gw.beat(heartbeat("http://127.0.0.1:9"), SECRET).raise_for_status()
        gw.beat(heartbeat("http://127.0.0.1:9", status="starting"), SECRET).raise_for_status()
        results: list[httpx.Response] = []
        _run(gw, results)  # the hold was for start-up only: no 30 s wait now
        assert results[0].status_code == 429 and results[0].json()["errors"][0]["code"] == 3040
