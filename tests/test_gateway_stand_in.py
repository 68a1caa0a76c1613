"""Stand-in models over real HTTP: a gateway in front of a fake node answers a text-generation
request for a model no node can host with the stand-in, says so (x-edgefire-stand-in, logs)
and prices it as the requested model; off, or for another task, the answer is a clear 5018."""

from __future__ import annotations

import contextlib
import sqlite3
import time

import pytest

from edgefire.contract.catalog import Catalog
from edgefire.contract.errors import ConfigError
from edgefire.contract.headers import STAND_IN
from edgefire.gateway.db import Database
from edgefire.gateway.dev import apply_dev_defaults
from edgefire.gateway.settings import GatewaySettings
from edgefire.gateway.stand_in import DEV_STAND_IN
from edgefire.gateway.state import GatewayState
from tests.gateway_fake_models import USAGE, WORDS, ModelUpstream
from tests.gateway_fakes import gateway, heartbeat

LLAMA = "@cf/meta/llama-3.1-8b-instruct"
SMOL = "@cf/huggingfacetb/smollm2-135m-instruct"
SMOL_INT4 = "@cf/huggingfacetb/smollm2-135m-instruct-int4"
BGE = "@cf/baai/bge-small-en-v1.5"
SECRET = "s"
LLAMA_PRICE = (0.282, 0.827)  # catalog.yaml, per M tokens in and out
SMOL_PRICE = (0.01, 0.02)
# Memory needs as the capacity planner gives them, and a node budget between the two.
NEED_MIB = {name: Catalog.load().get(name).need_bytes >> 20 for name in (SMOL, SMOL_INT4)}
BETWEEN_MIB = (NEED_MIB[SMOL] + NEED_MIB[SMOL_INT4]) // 2


def _cost(price: tuple[float, float]) -> float:
    return (USAGE["prompt_tokens"] * price[0] + USAGE["completion_tokens"] * price[1]) / 1e6


@pytest.fixture
def start(serve, tmp_path):
    """start(budget_mib=…, **settings) -> (gateway, fake node); stand-in SmolLM2 unless told."""
    with contextlib.ExitStack() as stack:
        def start(budget_mib: int = 1 << 20, **settings) -> tuple:
            node = ModelUpstream()
            node_url = stack.enter_context(serve(node))
            gw = stack.enter_context(gateway(serve, tmp_path, node_secret=SECRET,
                                             **{"stand_in_model": SMOL, **settings}))
            gw.beat(heartbeat(node_url, loaded_models={},
                              memory_budget_bytes=budget_mib << 20), SECRET).raise_for_status()
            return gw, node

        yield start


@pytest.fixture
def fleet(start):
    return start()


def _routes(gw, model: str) -> dict[str, tuple[str, dict]]:
    """route name -> (path, body) for one chat request to model, on each inference route."""
    acct = f"/client/v4/accounts/{gw.account_id}/ai"
    chat = {"model": model, "messages": [{"role": "user", "content": "Hi"}]}
    return {"native": (f"{acct}/run/{model}", {"prompt": "Hi"}),
            "gateway": (f"/v1/{gw.account_id}/default/workers-ai/{model}", {"prompt": "Hi"}),
            "openai": (f"{acct}/v1/chat/completions", chat),
            "compat": (f"/v1/{gw.account_id}/default/compat/chat/completions",
                       {**chat, "model": f"workers-ai/{model}"})}


def _log(gw, client, log_id: str) -> dict:
    url = f"/client/v4/accounts/{gw.account_id}/ai-gateway/gateways/default/logs/{log_id}"
    deadline = time.monotonic() + 5  # a stream's log is written as its relay ends
    while (response := client.get(url)).status_code == 404 and time.monotonic() < deadline:
        time.sleep(0.02)
    return response.json()["result"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ["native", "gateway", "openai", "compat"])
def test_a_planning_only_model_is_answered_by_the_stand_in(fleet, route, stream):
    gw, node = fleet
    path, body = _routes(gw, LLAMA)[route]
    with gw.client() as client:
        # cf-aig-gateway-id logs the plain routes' calls too.
        response = client.post(path, json={**body, "stream": stream},
                               headers={"cf-aig-gateway-id": "default"})
        assert response.status_code == 200, response.text
        assert response.headers[STAND_IN] == SMOL
        seen = node.seen[-1]
        if route in ("openai", "compat"):
            assert seen.path.endswith("/ai/v1/chat/completions") and seen.body["model"] == SMOL
            # The answer is honest about its model, streamed or not.
            assert f'"model": "{SMOL}"' in response.text or f'"model":"{SMOL}"' in response.text
        else:
            assert seen.path.endswith(f"/ai/run/{SMOL}")
        assert "".join(WORDS) in response.text or all(w in response.text for w in WORDS)
        record = _log(gw, client, response.headers["cf-aig-log-id"])
    assert record["model"] == LLAMA and record["stand_in"] == SMOL
    assert (record["tokens_in"], record["tokens_out"]) == (10, 20)
    assert record["cost"] == pytest.approx(_cost(LLAMA_PRICE))
    assert record["cost"] != pytest.approx(_cost(SMOL_PRICE))


def test_the_budget_between_the_two_needs_is_between_them():
    assert NEED_MIB[SMOL_INT4] < BETWEEN_MIB < NEED_MIB[SMOL]


def test_a_runnable_model_larger_than_every_node_is_stood_in(start):
    gw, node = start(stand_in_model=SMOL_INT4, budget_mib=BETWEEN_MIB)
    with gw.client() as client:
        big = client.post(f"/client/v4/accounts/{gw.account_id}/ai/run/{SMOL}",
                          json={"prompt": "Hi"})
        fits = client.post(f"/client/v4/accounts/{gw.account_id}/ai/run/{SMOL_INT4}",
                           json={"prompt": "Hi"})
    assert big.status_code == 200 and big.headers[STAND_IN] == SMOL_INT4
    assert fits.status_code == 200 and STAND_IN not in fits.headers
    assert [s.path.rsplit("/", 1)[1] for s in node.seen] == [SMOL_INT4.rsplit("/", 1)[1]] * 2


def test_a_model_a_node_can_host_is_never_stood_in(fleet):
    gw, node = fleet
    with gw.client() as client:
        response = client.post(f"/client/v4/accounts/{gw.account_id}/ai/run/"
                               "@cf/smollm2-135m-instruct", json={"prompt": "Hi"})  # an alias
    assert response.status_code == 200 and STAND_IN not in response.headers
    assert node.seen[-1].path.endswith("/ai/run/@cf/smollm2-135m-instruct")


def test_embeddings_are_never_stood_in(fleet):
    gw, node = fleet
    with gw.client() as client:
        response = client.post(f"/client/v4/accounts/{gw.account_id}/ai/v1/embeddings",
                               json={"model": BGE, "input": "hi"})
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "5018"
    assert "planning only" in error["message"] and "STAND_IN" not in error["message"]
    assert not node.seen


def test_off_a_planning_only_model_is_a_clear_5018_on_every_route(start):
    gw, node = start(stand_in_model=None)
    with gw.client() as client:
        for route, (path, body) in _routes(gw, LLAMA).items():
            response = client.post(path, json=body)
            assert response.status_code == 400, (route, response.text)
            data = response.json()
            if route in ("openai", "compat"):
                code, message = data["error"]["code"], data["error"]["message"]
                assert code == "5018"
            else:
                code, message = data["errors"][0]["code"], data["errors"][0]["message"]
                assert code == 5018
            assert message == (f"{LLAMA} is listed for planning only and cannot run on this "
                               "machine; set EDGEFIRE_STAND_IN_MODEL to answer it with a "
                               "stand-in model")
    assert not node.seen


def test_off_a_model_larger_than_every_node_is_5018_not_429(start):
    gw, node = start(stand_in_model=None, budget_mib=BETWEEN_MIB)
    with gw.client() as client:
        response = client.post(f"/client/v4/accounts/{gw.account_id}/ai/run/{SMOL}",
                               json={"prompt": "Hi"})
    assert response.status_code == 400
    assert response.json()["errors"][0] == {"code": 5018, "message": (
        f"{SMOL} needs {NEED_MIB[SMOL]} MiB, more than any live node offers (largest budget "
        f"{BETWEEN_MIB} MiB); set EDGEFIRE_STAND_IN_MODEL to answer it with a stand-in model")}
    assert not node.seen


@pytest.mark.parametrize("model", [BGE, LLAMA, "@cf/no/such-model"])
def test_a_stand_in_that_cannot_stand_in_is_refused_at_start(model):
    with pytest.raises(ConfigError, match="EDGEFIRE_STAND_IN_MODEL"):
        GatewayState.build(GatewaySettings(stand_in_model=model, redis_url=None),
                           db=Database(":memory:"))


def test_dev_turns_stand_ins_and_faults_on_and_the_environment_can_turn_them_off(monkeypatch):
    settings = GatewaySettings()
    assert (settings.stand_in_model, settings.fault_injection) == (None, False)  # start
    apply_dev_defaults(settings)
    assert (settings.stand_in_model, settings.fault_injection) == (DEV_STAND_IN, True)
    monkeypatch.setenv("EDGEFIRE_STAND_IN_MODEL", "")
    monkeypatch.setenv("EDGEFIRE_FAULT_INJECTION", "false")
    settings = GatewaySettings()
    apply_dev_defaults(settings)
    assert (settings.stand_in_model, settings.fault_injection) == ("", False)
    state = GatewayState.build(settings, db=Database(":memory:"))
    assert state.providers["workers-ai"].stand_ins.spec is None


def test_a_log_table_from_before_stand_ins_gains_the_column(tmp_path):
    path = tmp_path / "gateway.db"
    with contextlib.closing(Database(path)) as db:
        db.execute("ALTER TABLE logs DROP COLUMN stand_in")  # as a database made before
    with contextlib.closing(sqlite3.connect(path)) as old:
        assert "stand_in" not in {row[1] for row in old.execute("PRAGMA table_info(logs)")}
    with contextlib.closing(Database(path)) as db:
        assert "stand_in" in {row["name"] for row in db.query("PRAGMA table_info(logs)")}
