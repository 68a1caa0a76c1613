"""A Worker's env.AI against the gateway (gateway/routes_binding.py), over real HTTP: the
requests are the bytes workerd 1.20260426.1 (wrangler 4.86.0) sent, captured on the wire, both
as the wrangler plugin's external service sends them (direct) and as Miniflare's
remoteProxyConnectionString wraps them (MF-URL, MF-Header-*). A fake edge node answers."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.gateway_fakes import MODEL, Gateway, gateway, heartbeat, read_json

SECRET = "fleet-secret"
SSE = (b'data: {"response":"Hel"}\n\n', b'data: {"response":"lo"}\n\n',
       b'data: {"response":"","usage":{"prompt_tokens":3,"completion_tokens":2,'
       b'"total_tokens":5}}\n\n', b"data: [DONE]\n\n")
NODE_ERROR = {"result": None, "success": False, "messages": [],
              "errors": [{"code": 5006, "message": "prompt must be a string"}]}

# As captured: header order, case and values are workerd's; {host}/{length}/{auth} are filled.
DIRECT_POST = ("POST {target} HTTP/1.1\r\nContent-Length: {length}\r\nHost: workers-binding.ai\r\n"
               "Content-Type: application/json\r\n{auth}cf-consn-model-id: {model}\r\n"
               "cf-consn-sdk-version: 2.0.0\r\n\r\n")
DIRECT_GET = "GET {target} HTTP/1.1\r\nHost: workers-binding.ai\r\n{auth}\r\n"
WRAPPED_POST = ("POST / HTTP/1.1\r\nContent-Length: {length}\r\nHost: {host}\r\nMF-Binding: AI\r\n"
                "{auth}MF-Header-cf-consn-model-id: {model}\r\n"
                "MF-Header-cf-consn-sdk-version: 2.0.0\r\nMF-Header-content-length: {length}\r\n"
                "MF-Header-content-type: application/json\r\n"
                "MF-URL: https://workers-binding.ai{target}\r\n\r\n")
WRAPPED_GET = ("GET / HTTP/1.1\r\nHost: {host}\r\nMF-Binding: AI\r\n{auth}"
               "MF-URL: https://workers-binding.ai{target}\r\n\r\n")
WS_PROBE = ("GET /?MF-Binding=AI HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            "Sec-WebSocket-Key: vFVLtFe8ewHmPQY2o7w8Sg==\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Extensions: permessage-deflate\r\nHost: {host}\r\n\r\n")
FORMS = ("direct", "wrapped")


@dataclass
class FakeNode:
    """An edge node: SSE for `stream`, a 5006 for a non-string prompt, else a numbered answer
    (so a cached answer is told from a fresh one)."""

    bodies: list[dict] = field(default_factory=list)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = await read_json(receive)
        self.bodies.append(body)
        if body.get("stream"):
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            for chunk in SSE:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        status, answer = 200, {"result": {"response": f"answer {len(self.bodies)}"},
                               "success": True, "errors": [], "messages": []}
        if not isinstance(body.get("prompt"), str):
            status, answer = 400, NODE_ERROR
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": json.dumps(answer).encode()})


@dataclass
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> object:
        return json.loads(self.body)


@dataclass
class Binding:
    """Sends a call as workerd does, in one form, with an optional bearer token."""

    gw: Gateway
    form: str
    token: str | None = None
    host: str | None = None  # the outer Host, if not the real one

    def _send(self, head: str, body: bytes = b"") -> Answer:
        url = self.gw.url.removeprefix("http://")
        hostname, port = url.split(":")
        with socket.create_connection((hostname, int(port)), timeout=30) as sock:
            sock.sendall(head.encode() + body)
            response = http.client.HTTPResponse(sock)
            response.begin()
            return Answer(response.status, response.headers, response.read())

    def _fill(self, template: str, target: str, length: int = 0, model: str = MODEL) -> str:
        auth = ""
        if self.token:
            name = "Authorization" if self.form == "direct" else "MF-Header-authorization"
            auth = f"{name}: Bearer {self.token}\r\n"
        head = template.format(target=target, length=length, auth=auth, model=model,
                               host=self.gw.url.removeprefix("http://"))
        if self.host is not None:
            head = head.replace(self.gw.url.removeprefix("http://"), self.host).replace(
                "Host: workers-binding.ai", f"Host: {self.host}")
        return head

    def post(self, target: str, inputs: dict, options: dict | None = None,
             model: str = MODEL) -> Answer:
        body = json.dumps({"inputs": inputs, "options": options or {}},
                          separators=(",", ":")).encode()
        template = DIRECT_POST if self.form == "direct" else WRAPPED_POST
        return self._send(self._fill(template, target, len(body), model), body)

    def get(self, target: str) -> Answer:
        return self._send(self._fill(DIRECT_GET if self.form == "direct" else WRAPPED_GET,
                                     target))

    def run(self, inputs: dict, model: str = MODEL) -> Answer:
        return self.post("/run?version=3", inputs, model=model)


@pytest.fixture
def fleet(serve, tmp_path) -> Iterator[tuple[Gateway, FakeNode]]:
    """A gateway bound to a dev account (as edge-gateway dev makes it), and its fake node."""
    node = FakeNode()
    with serve(node) as node_url, gateway(serve, tmp_path, node_secret=SECRET) as gw:
        gw.state.settings.binding_account = gw.account_id
        gw.beat(heartbeat(node_url), SECRET).raise_for_status()
        yield gw, node


def _is_error(answer: Answer, status: int, code: int) -> str:
    assert answer.status == status, answer.body
    errors = answer.json()["errors"]
    assert errors[0]["code"] == code
    return errors[0]["message"]


@pytest.mark.parametrize("form", FORMS)
def test_run_answers_the_bare_result_as_exactly_application_json(fleet, form):
    gw, node = fleet
    answer = Binding(gw, form).run({"prompt": "Hi", "max_tokens": 8})
    assert answer.status == 200
    assert answer.headers["content-type"] == "application/json"  # no charset: else a stream
    assert answer.json() == {"response": "answer 1"}
    assert answer.headers["cf-ai-req-id"]
    assert node.bodies == [{"prompt": "Hi", "max_tokens": 8}]  # the inputs, as a REST body


@pytest.mark.parametrize("form", FORMS)
def test_a_stream_is_the_nodes_sse_byte_for_byte(fleet, form):
    gw, _ = fleet
    answer = Binding(gw, form).run({"prompt": "Hi", "stream": True})
    assert answer.status == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert answer.body == b"".join(SSE)


@pytest.mark.parametrize("form", FORMS)
def test_errors_have_the_shape_run_throws_with_the_code(fleet, form):
    gw, node = fleet
    binding = Binding(gw, form)
    assert _is_error(binding.run({"prompt": 42}), 400, 5006) == "prompt must be a string"
    message = _is_error(binding.run({"prompt": "Hi"}, model="@cf/no/such-model"), 400, 5007)
    assert "@cf/no/such-model" in message
    _is_error(binding.post("/run?version=3", []), 400, 5006)  # inputs not an object
    assert len(node.bodies) == 1  # only the first reached the node


@pytest.mark.parametrize("form", FORMS)
def test_gateway_options_cache_the_second_call_and_log_both(fleet, form):
    gw, node = fleet
    binding = Binding(gw, form)
    options = {"gateway": {"id": "default", "cacheTtl": 3600, "metadata": {"user": "u1"}}}
    first = binding.post("/ai-gateway/run?version=3", {"prompt": "Hi"}, options)
    second = binding.post("/ai-gateway/run?version=3", {"prompt": "Hi"}, options)
    assert first.headers["cf-aig-cache-status"] == "MISS"
    assert second.headers["cf-aig-cache-status"] == "HIT"
    assert first.json() == second.json() == {"response": "answer 1"}
    assert second.headers["content-type"] == "application/json"
    assert len(node.bodies) == 1
    skipped = binding.post("/ai-gateway/run?version=3", {"prompt": "Hi"},
                           {"gateway": {**options["gateway"], "skipCache": True}})
    assert skipped.json() == {"response": "answer 2"}
    # env.AI.gateway(id).getLog(env.AI.aiGatewayLogId), and the REST logs API, agree.
    log_id = second.headers["cf-aig-log-id"]
    log = binding.get(f"/ai-gateway/gateways/default/logs/{log_id}").json()["result"]
    assert log["cached"] is True and json.loads(log["metadata"]) == {"user": "u1"}
    assert log["request_type"] == "Workers AI Binding"
    with gw.client() as client:
        rows = client.get(f"/client/v4/accounts/{gw.account_id}/ai-gateway/gateways/default"
                          "/logs", params={"order_by_direction": "asc"}).json()["result"]
    assert [row["cached"] for row in rows] == [False, True, False]
    _is_error(binding.get("/ai-gateway/gateways/default/logs/nope"), 404, 1004)


@pytest.mark.parametrize("form", FORMS)
def test_a_gateway_option_is_checked_as_its_header_is(fleet, form):
    gw, node = fleet
    binding = Binding(gw, form)
    bad_ttl = {"gateway": {"id": "default", "cacheTtl": "soon"}}
    assert "cf-aig-cache-ttl" in _is_error(
        binding.post("/ai-gateway/run?version=3", {"prompt": "Hi"}, bad_ttl), 400, 5006)
    _is_error(binding.post("/ai-gateway/run?version=3", {"prompt": "Hi"},
                           {"gateway": {"id": "missing"}}), 404, 1004)
    assert node.bodies == []


@pytest.mark.parametrize("form", FORMS)
def test_models_search_answers_result_from_the_catalog(fleet, form):
    gw, _ = fleet
    answer = Binding(gw, form).get("/ai-api/models/search?search=minilm")
    assert answer.status == 200
    names = [model["name"] for model in answer.json()["result"]]
    assert names and all("minilm" in name for name in names)


@pytest.mark.parametrize("form", FORMS)
def test_unauthenticated_calls_need_the_dev_binding_and_this_machine(fleet, form):
    gw, _ = fleet
    inputs = {"prompt": "Hi"}
    assert Binding(gw, form).run(inputs).status == 200
    # A page on a name rebound to 127.0.0.1 sends its own Host (and cannot send the binding's).
    _is_error(Binding(gw, form, host="attacker.example:80").run(inputs), 401, 10000)
    _is_error(Binding(gw, form, token="ef_not-a-token").run(inputs), 401, 10000)
    gw.state.settings.binding_account = None  # edge-gateway start
    _is_error(Binding(gw, form).run(inputs), 401, 10000)
    _is_error(Binding(gw, form).get("/ai-api/models/search"), 401, 10000)
    # The plugin's token (injectRequestHeaders) works without the dev binding.
    assert Binding(gw, form, token=gw.token).run(inputs).json() == {"response": "answer 2"}


def test_a_renamed_host_header_does_not_count_as_the_host(fleet):
    gw, _ = fleet
    binding = Binding(gw, "wrapped", host="attacker.example:80")
    body = json.dumps({"inputs": {"prompt": "Hi"}, "options": {}}).encode()
    head = binding._fill(WRAPPED_POST, "/run?version=3", len(body)).replace(
        "MF-Binding: AI\r\n", "MF-Binding: AI\r\nMF-Header-host: workers-binding.ai\r\n")
    _is_error(binding._send(head, body), 401, 10000)


def test_unknown_targets_and_methods_and_the_websocket_probe(fleet):
    gw, _ = fleet
    wrapped = Binding(gw, "wrapped")
    _is_error(wrapped.get("/autorag/rags"), 404, 7000)
    _is_error(wrapped.get("/run?version=3"), 405, 7001)
    _is_error(Binding(gw, "direct").get("/run?version=3"), 405, 7001)
    probe = wrapped._send(WS_PROBE.format(host=gw.url.removeprefix("http://")))
    assert probe.status in (403, 404)  # Miniflare only tries it; no upgrade here
    assert wrapped.run({"prompt": "Hi"}).status == 200


@pytest.mark.parametrize("form", FORMS)
def test_an_injected_fault_reaches_the_worker_as_the_matching_error(serve, tmp_path, form):
    """x-edgefire-fault (a Worker's run() `extraHeaders`) fails the call as production would."""
    node = FakeNode()
    with serve(node) as node_url, gateway(serve, tmp_path, node_secret=SECRET,
                                          fault_injection=True) as gw:
        gw.state.settings.binding_account = gw.account_id
        gw.beat(heartbeat(node_url), SECRET).raise_for_status()
        binding = Binding(gw, form)
        body = json.dumps({"inputs": {"prompt": "Hi"}, "options": {}}).encode()
        name = "x-edgefire-fault" if form == "direct" else "MF-Header-x-edgefire-fault"
        for fault, status, code in (("capacity", 429, 3040), ("server-error", 500, 3001),
                                    ("rate-limit", 429, 2003)):
            head = binding._fill(DIRECT_POST if form == "direct" else WRAPPED_POST,
                                 "/run?version=3", len(body))
            head = head.replace("cf-consn-sdk-version: 2.0.0\r\n",
                                f"cf-consn-sdk-version: 2.0.0\r\n{name}: {fault}\r\n", 1)
            _is_error(binding._send(head, body), status, code)
        assert node.bodies == []


def test_a_model_no_node_can_run_is_answered_by_the_stand_in(serve, tmp_path):
    node = FakeNode()
    with serve(node) as node_url, gateway(serve, tmp_path, node_secret=SECRET,
                                          stand_in_model=MODEL) as gw:
        gw.state.settings.binding_account = gw.account_id
        gw.beat(heartbeat(node_url), SECRET).raise_for_status()
        answer = Binding(gw, "direct").run({"prompt": "Hi"}, model="@cf/meta/llama-3.1-8b-instruct")
    assert answer.status == 200 and answer.json() == {"response": "answer 1"}
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers["x-edgefire-stand-in"] == MODEL
