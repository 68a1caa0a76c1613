"""Async batch: queue, poll, per-item answers, durability across a gateway restart, retention."""

from __future__ import annotations

import time

import httpx
import pytest

from edgefire.contract.errors import InvalidInputError, NotFoundError
from edgefire.gateway.app import create_app
from edgefire.gateway.batches import BatchStore
from edgefire.gateway.db import Database
from edgefire.gateway.settings import GatewaySettings
from edgefire.gateway.state import GatewayState
from tests.gateway_fakes import ANSWER, MODEL, RecordingUpstream, heartbeat

RUN = "/client/v4/accounts/{account}/ai/run/" + MODEL


@pytest.fixture
def store(tmp_path):
    return BatchStore(Database(tmp_path / "gw.db"), retention_s=60)


def test_items_run_in_order_and_the_poll_answers_once_all_are_done(store):
    queued = store.enqueue("acct", MODEL, {"requests": [
        {"prompt": "a", "external_reference": "first"}, {"prompt": "b"}]})
    assert queued["status"] == "queued" and queued["model"] == MODEL
    batch = queued["request_id"]
    first = store.take()
    assert (first.idx, first.inputs) == (0, {"prompt": "a"})  # the reference is not an input
    assert store.poll("acct", batch)["status"] == "running"
    store.finish(first, True, {"response": "A", "usage": {"prompt_tokens": 3,
                                                          "completion_tokens": 1,
                                                          "total_tokens": 4}})
    second = store.take()
    store.finish(second, False, [{"code": 5006, "message": "bad"}])
    assert store.take() is None
    done = store.poll("acct", batch)
    assert done["responses"] == [
        {"id": 0, "success": True, "external_reference": "first",
         "result": {"response": "A", "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                                               "total_tokens": 4}}},
        {"id": 1, "success": False, "external_reference": None,
         "errors": [{"code": 5006, "message": "bad"}]}]
    assert done["usage"] == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}


def test_another_account_cannot_poll_a_batch(store):
    batch = store.enqueue("acct", MODEL, {"requests": [{"prompt": "a"}]})["request_id"]
    with pytest.raises(NotFoundError):
        store.poll("other", batch)


@pytest.mark.parametrize("body", [{}, {"requests": []}, {"requests": ["text"]},
                                  {"requests": [{"prompt": "a", "stream": True}]},
                                  {"requests": [{"prompt": "a"}] * 1001}])
def test_malformed_batches_are_refused(store, body):
    with pytest.raises(InvalidInputError) as info:
        store.enqueue("acct", MODEL, body)
    assert info.value.field == "requests"


def test_an_item_taken_before_a_restart_is_queued_again(tmp_path):
    store = BatchStore(Database(tmp_path / "gw.db"), retention_s=60)
    store.enqueue("acct", MODEL, {"requests": [{"prompt": "a"}]})
    assert store.take() is not None and store.take() is None
    restarted = BatchStore(Database(tmp_path / "gw.db"), retention_s=60)
    assert restarted.take().inputs == {"prompt": "a"}


def test_answers_are_kept_for_the_retention_time(store):
    batch = store.enqueue("acct", MODEL, {"requests": [{"prompt": "a"}]})["request_id"]
    store.finish(store.take(), True, {"response": "A"})
    assert store.purge() == 0 and store.poll("acct", batch)["responses"]
    assert store.purge(now=time.time() + 61) == 1
    with pytest.raises(NotFoundError):
        store.poll("acct", batch)


def test_a_batch_queued_before_a_restart_is_answered_after_it(serve, tmp_path, monkeypatch):
    settings = GatewaySettings(gateway_db=tmp_path / "gw.db", redis_url=None)
    upstream = RecordingUpstream()

    def build() -> GatewayState:
        return GatewayState.build(settings, db=Database(settings.gateway_db))

    state = build()
    account = state.accounts.create_account("a").id
    _, token = state.accounts.create_token(account)
    headers = {"authorization": f"Bearer {token}"}
    # The first gateway stops before its worker takes anything.
    with monkeypatch.context() as patch:
        patch.setattr("edgefire.gateway.batches.BatchWorker.start", lambda self: None)
        with serve(create_app(state)) as url:
            queued = httpx.post(url + RUN.format(account=account) + "?queueRequest=true",
                                json={"requests": [{"prompt": "a"}, {"prompt": "b"}]},
                                headers=headers).json()["result"]
    assert queued["status"] == "queued"
    state = build()
    with serve(upstream) as node_url, serve(create_app(state)) as url:
        state.directory.heartbeat(heartbeat(node_url))
        deadline = time.monotonic() + 20
        while True:
            polled = httpx.post(url + RUN.format(account=account),
                                json={"request_id": queued["request_id"]},
                                headers=headers).json()["result"]
            if "responses" in polled or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert [r["result"] for r in polled["responses"]] == [ANSWER["result"]] * 2
    assert [seen.body for seen in upstream.seen] == [{"prompt": "a"}, {"prompt": "b"}]


def test_the_worker_retries_an_item_no_node_can_take_and_yields_to_waiting_traffic(store):
    import asyncio

    from edgefire.gateway.batches import BatchWorker, RetryLater

    batch = store.enqueue("acct", MODEL, {"requests": [{"prompt": "a"}]})["request_id"]
    attempts, busy_checks = [], []

    async def run_item(account_id, model, inputs):
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            raise RetryLater  # no capacity yet: back to the queue, not failed
        return True, {"response": "A"}

    def busy() -> bool:
        busy_checks.append(1)
        return len(busy_checks) < 3  # interactive requests wait for the first two checks

    async def scenario() -> dict:
        worker = BatchWorker(store, run_item, busy, idle_poll_s=0.01, retry_after_s=0.05)
        worker.start()
        for _ in range(200):
            await asyncio.sleep(0.02)
            polled = store.poll("acct", batch)
            if "responses" in polled:
                break
        await worker.stop()
        return polled

    polled = asyncio.run(scenario())
    assert polled["responses"][0]["result"] == {"response": "A"}
    assert len(attempts) == 2 and len(busy_checks) >= 3
