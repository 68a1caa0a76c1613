"""Record/replay of a Worker's env.AI calls over real HTTP: the bytes workerd sends (direct, and
wrapped by Miniflare) are recorded against a fake node, then replayed by a gateway with no node,
byte for byte, each form from the other's recording."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgefire.contract.errors import ReplayMissError
from tests.gateway_fakes import MODEL, gateway, heartbeat
from tests.test_binding_protocol import SECRET, SSE, Answer, Binding, FakeNode

RUN, AIG_RUN = "/run?version=3", "/ai-gateway/run?version=3"
GATEWAY = {"gateway": {"id": "default", "metadata": {"suite": "replay"}}}
# (form it is recorded in, target, inputs, options); the first two are the same call.
CALLS = [
    ("direct", RUN, {"prompt": "Hi"}, None),
    ("wrapped", RUN, {"prompt": "Hi"}, None),
    ("direct", RUN, {"prompt": "Hi", "stream": True}, None),
    ("wrapped", RUN, {"prompt": "Hey", "stream": True}, None),
    ("wrapped", AIG_RUN, {"prompt": "Hi"}, GATEWAY),
    ("direct", RUN, {"prompt": 42}, None),
]
OTHER = {"direct": "wrapped", "wrapped": "direct"}


def _seen(answer: Answer) -> tuple[int, dict[str, str], bytes]:
    # date and server are the HTTP server's, set on every answer; the rest is the app's.
    headers = {k.lower(): v for k, v in answer.headers.items()
               if k.lower() not in ("date", "server")}
    return answer.status, headers, answer.body


@pytest.fixture(scope="module")
def recorded(serve, tmp_path_factory) -> tuple[Path, list[tuple[int, dict[str, str], bytes]]]:
    folder = tmp_path_factory.mktemp("binding-recordings")
    node = FakeNode()
    with serve(node) as node_url, gateway(serve, folder, node_secret=SECRET,
                                          record_dir=folder) as gw:
        gw.state.settings.binding_account = gw.account_id
        gw.beat(heartbeat(node_url), SECRET).raise_for_status()
        seen = [_seen(Binding(gw, form).post(target, inputs, options))
                for form, target, inputs, options in CALLS]
        # Models search only reads the catalog: answered live, never recorded.
        assert Binding(gw, "wrapped").get("/ai-api/models/search?search=minilm").status == 200
    assert len(node.bodies) == 6  # each reached the node (which refuses the bad input)
    return folder, seen


def _replaying(serve, folder: Path, **settings):
    return gateway(serve, folder, replay_dir=folder, replay_speed=0, **settings)


def test_recording_keys_the_unwrapped_call_with_its_model(recorded) -> None:
    folder, seen = recorded
    assert [status for status, _, _ in seen] == [200, 200, 200, 200, 200, 400]
    assert seen[2][2] == b"".join(SSE)
    documents = [json.loads(f.read_text()) for f in sorted(folder.glob("*.json"))]
    assert len(documents) == 5  # one per distinct call: direct and wrapped "Hi" share one
    for document in documents:
        request = document["request"]
        assert request["path"] in (RUN, AIG_RUN)  # unwrapped, no account
        assert request["headers"]["cf-consn-model-id"] == MODEL
        assert not any(name.startswith("mf-") for name in request["headers"])
        assert "authorization" not in json.dumps(request).lower()
    shared = next(d for d in documents if d["request"]["body"]["inputs"] == {"prompt": "Hi"}
                  and d["request"]["path"] == RUN)
    assert len(shared["responses"]) == 2
    assert {f.name.rsplit("-", 1)[0] for f in folder.glob("*.json")} == {
        "run-cf-huggingfacetb-smollm2-135m-instruct",
        "ai-gateway-run-cf-huggingfacetb-smollm2-135m-instruct"}


def test_each_form_replays_the_others_recording_byte_for_byte(serve, recorded) -> None:
    folder, seen = recorded
    with _replaying(serve, folder) as gw:  # no node registered: only the recordings answer
        gw.state.settings.binding_account = gw.account_id  # a new dev account: not in the key
        replayed = [_seen(Binding(gw, OTHER[form]).post(target, inputs, options))
                    for form, target, inputs, options in CALLS]
        searched = Binding(gw, "direct").get("/ai-api/models/search?search=minilm")
    assert replayed == seen
    assert replayed[0][1]["content-type"] == "application/json"
    assert json.loads(replayed[0][2]) == {"response": "answer 1"}
    assert json.loads(replayed[1][2]) == {"response": "answer 2"}
    assert replayed[2][2] == replayed[3][2] == b"".join(SSE)
    assert json.loads(replayed[5][2])["errors"][0]["code"] == 5006  # a recorded error
    assert searched.status == 200 and searched.json()["result"]  # still live


@pytest.mark.parametrize("form", ["direct", "wrapped"])
def test_a_miss_is_5090_in_the_bindings_error_shape(serve, recorded, form) -> None:
    folder, _ = recorded
    with _replaying(serve, folder) as gw:
        gw.state.settings.binding_account = gw.account_id
        binding = Binding(gw, form)
        miss = binding.run({"prompt": "Hello"})
        other_model = binding.run({"prompt": "Hi"}, model="@cf/baai/bge-small-en-v1.5")
        for _ in range(2):
            binding.run({"prompt": "Hi"})
        exhausted = binding.run({"prompt": "Hi"})
    for answer in (miss, other_model, exhausted):
        assert answer.status == 404
        assert answer.headers["content-type"] == "application/json"
        assert answer.headers["cf-ai-req-id"]
        body = answer.json()
        assert body["success"] is False and body["result"] is None
        assert body["errors"][0]["code"] == ReplayMissError.code
    message = miss.json()["errors"][0]["message"]
    assert message.startswith(f"No recording matches this request (POST {RUN})")
    assert "the nearest recording differs in body.inputs.prompt: recorded " in message
    assert message.endswith('sent "Hello"')
    assert "headers.cf-consn-model-id" in other_model.json()["errors"][0]["message"]
    assert "recorded 2 time(s) and this is call 3" in exhausted.json()["errors"][0]["message"]


@pytest.mark.parametrize("form", ["direct", "wrapped"])
def test_replay_keeps_the_bindings_authentication_rule(serve, recorded, form) -> None:
    folder, seen = recorded
    inputs = {"prompt": "Hi", "stream": True}
    with _replaying(serve, folder) as gw:
        gw.state.settings.binding_account = gw.account_id
        refused = [Binding(gw, form, host="attacker.example:80").run(inputs),
                   Binding(gw, form, token="ef_not-a-token").run(inputs)]
        gw.state.settings.binding_account = None  # edge-gateway start: a token is needed
        refused.append(Binding(gw, form).run(inputs))
        with_token = Binding(gw, form, token=gw.token).run(inputs)
    for answer in refused:
        assert answer.status == 401
        assert answer.json()["errors"][0]["code"] == 10000
    assert _seen(with_token) == seen[2]  # a refusal does not use up a recorded answer
