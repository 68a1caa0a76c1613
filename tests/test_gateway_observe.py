"""What the dashboard reads, over real HTTP: the fleet view, the node header, the gateway's
Prometheus metrics and their history, log bodies and the metadata filter, the dev sign-in."""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest

from edgefire.contract.cities import all_cities
from edgefire.gateway.logs import BODY_LIMIT, BodyCapture, captured_body
from edgefire.gateway.metrics import BUCKETS, GatewayMetrics
from edgefire.gateway.metrics_history import MetricsHistory, quantile
from tests.gateway_fakes import MODEL, CountingNode, gateway, heartbeat

SECRET = "node-secret"


@pytest.fixture
def fleet(serve, tmp_path):
    node = CountingNode(gap_s=0.05)
    with serve(node) as node_url, gateway(serve, tmp_path, node_secret=SECRET,
                                          admin_token="admin") as gw:
        gw.beat(heartbeat(node_url, running=2, waiting=3, kv_usage=0.25,
                          memory_budget_bytes=820 << 20,
                          loaded_models={MODEL: {"weight_precision": "bf16"}}),
                SECRET).raise_for_status()
        yield gw, node


class Api:
    """The account's client: runs of MODEL and reads of its routes."""

    def __init__(self, gw) -> None:
        self.client = gw.client()
        self.base = f"/client/v4/accounts/{gw.account_id}"

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def run(self, prompt: str = "Hi", **headers: str) -> httpx.Response:
        return self.client.post(f"{self.base}/ai/run/{MODEL}", json={"prompt": prompt},
                                headers=headers)

    def stream(self, **headers: str) -> bytes:
        with self.client.stream("POST", f"{self.base}/ai/run/{MODEL}", headers=headers,
                                json={"prompt": "Hi", "stream": True}) as answer:
            assert answer.headers["x-edgefire-node"] == "fra"
            return answer.read()

    def get(self, path: str, **params: object) -> httpx.Response:
        return self.client.get(f"{self.base}{path}", params=params)

    def result(self, path: str, **params: object):
        answer = self.get(path, **params)
        assert answer.status_code == 200, answer.text
        return answer.json()["result"]


def test_fleet_lists_every_city_with_load_and_hosting_verdicts_and_no_node_secrets(fleet):
    gw, _ = fleet
    with Api(gw) as api:
        view = api.result("/ai/fleet")
    cities = {c["code"]: c for c in view["cities"]}
    assert set(cities) == {c.code for c in all_cities()}
    fra = cities["fra"]
    assert (fra["status"], fra["healthy"], fra["running"], fra["waiting"], fra["kv_usage"]) == \
        ("ok", True, 2, 3, 0.25)
    assert fra["loaded_models"] == [{"id": MODEL, "weight_precision": "bf16"}]
    assert fra["accelerators"]["kind"] and 0 <= fra["heartbeat_age_s"] < 5
    verdicts = {h["model"]: h["verdict"] for h in fra["hosts"]}
    assert verdicts[MODEL] == "loaded"
    # catalog.yaml: int8 needs 800 MiB, Unweight 840 MiB; the node has 820 MiB.
    assert verdicts[f"{MODEL}-int8"] == "fits" and verdicts[f"{MODEL}-unweight"] == "too_big"
    assert verdicts["@cf/meta/llama-3.1-8b-instruct"] == "planning_only"
    others = [c for code, c in cities.items() if code != "fra"]
    assert all(c["status"] == "offline" and c["heartbeat_age_s"] is None for c in others)
    assert all(c["loaded_models"] == [] and c["running"] == 0 for c in others)
    assert "url" not in json.dumps(view) and "credential" not in json.dumps(view)


def test_fleet_and_history_need_the_accounts_token(fleet):
    gw, _ = fleet
    other = gw.state.accounts.create_account("b").id
    for path in ("/ai/fleet", "/ai/metrics/history"):
        assert httpx.get(f"{gw.url}/client/v4/accounts/{gw.account_id}{path}").status_code == 401
        with gw.client() as client:
            answer = client.get(f"/client/v4/accounts/{other}{path}")
        assert answer.status_code == 403 and answer.json()["success"] is False
    with Api(gw) as api:
        bad = api.get("/ai/metrics/history", window_s=5)
    assert bad.status_code == 400 and bad.json()["errors"][0]["code"] == 5006


def test_answers_name_their_node_and_prometheus_counts_each_outcome(fleet):
    gw, _ = fleet
    with Api(gw) as api:
        gateway_id = {"cf-aig-gateway-id": "dash"}
        api.client.post(f"{api.base}/ai-gateway/gateways",
                        json={"id": "dash", "cache_ttl": 60}).raise_for_status()
        first = api.run(**gateway_id)
        assert first.headers["x-edgefire-node"] == "fra"
        hit = api.run(**gateway_id)
        assert hit.headers["cf-aig-cache-status"] == "HIT" and "x-edgefire-node" not in hit.headers
        assert api.run("fail").status_code == 400
        api.stream()
        api.client.put(f"{api.base}/ai-gateway/gateways/dash",
                       json={"rate_limiting_limit": 1, "rate_limiting_interval": 60,
                             "cache_ttl": 0, "collect_logs": True}).raise_for_status()
        statuses = [api.run(f"new {i}", **gateway_id).status_code for i in range(3)]
        assert 429 in statuses
        assert httpx.get(f"{gw.url}/metrics").status_code == 401
        text = httpx.get(f"{gw.url}/metrics", headers={"authorization": "Bearer admin"}).text
    counts = {outcome: _sample(text, "edgefire_gateway_requests_total",
                               f'account="{gw.account_id}",outcome="{outcome}"')
              for outcome in ("ok", "cached", "error", "rate_limited")}
    assert counts["cached"] == 1 and counts["error"] == 1 and counts["rate_limited"] >= 1
    assert counts["ok"] >= 2  # the first run, the stream, and the run the limit let through
    # The stream's three text events: a first token, then two gaps.
    assert _sample(text, "edgefire_gateway_time_to_first_token_seconds_count",
                   f'account="{gw.account_id}"') == 1
    assert _sample(text, "edgefire_gateway_inter_token_latency_seconds_count",
                   f'account="{gw.account_id}"') == 2


def _sample(text: str, name: str, labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"{name}{{{labels}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_history_reads_the_same_counters_as_rates_and_quantiles():
    metrics, now = GatewayMetrics(), [1000.0]
    history = MetricsHistory(metrics, interval_s=2.0, clock=lambda: now[0])
    history.sample()
    started = time.perf_counter()
    for _ in range(3):
        metrics.answered("a", 200, False, 10, started)
    metrics.answered("a", 200, True, 10, started)
    metrics.refused("a", rate_limited=True)
    metrics.answered("b", 500, False, 0, started)  # another account's: not in a's series
    for gap in (0.02, 0.03, 0.5):
        metrics.itl.labels("a").observe(gap)
    now[0] += 2.0
    history.sample()
    result = history.series("a", 60)
    series = result["series"]
    assert series["t"] == [1002.0]
    assert series["requests_per_s"] == [2.5] and series["output_tokens_per_s"] == [20.0]
    assert series["cache_hit_rate"] == [0.25] and series["rate_limited"] == [1]
    assert series["errors"] == [0] and series["ttft_p50_ms"] == [None]
    assert 20 < series["itl_p50_ms"][0] <= 40 and 250 < series["itl_p99_ms"][0] <= 500
    assert result["totals"] == {"requests": 5, "output_tokens": 40, "cache_hits": 1,
                                "rate_limited": 1, "errors": 0}
    assert history.series("nobody", 60)["series"]["requests_per_s"] == [0.0]


def test_quantile_interpolates_within_its_bucket():
    before = [0.0] * (len(BUCKETS) + 1)
    after = [0.0] * len(BUCKETS) + [0.0]
    i = BUCKETS.index(0.1)  # 4 observations in (0.08, 0.1]
    after[i:] = [4.0] * (len(after) - i)
    assert quantile(0.5, before, after) == pytest.approx(0.09)
    assert quantile(0.5, before, before) is None
    after[-1] = 8.0  # 4 more past the last bound
    assert quantile(0.99, before, after) == BUCKETS[-1]


def test_history_over_http_moves_once_requests_are_answered(fleet):
    gw, _ = fleet
    with Api(gw) as api:
        api.run().raise_for_status()
        deadline = time.monotonic() + 10
        while True:
            result = api.result("/ai/metrics/history", window_s=60)
            if result["totals"]["requests"] >= 1 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert result["totals"]["requests"] == 1 and result["interval_s"] == 2.0
    lengths = {len(values) for values in result["series"].values()}
    assert len(lengths) == 1  # every series has a point per interval


def test_logs_keep_bodies_and_filter_by_metadata(fleet):
    gw, _ = fleet
    logs = "/ai-gateway/gateways/default/logs"
    with Api(gw) as api:
        for user in ("alice", "bob"):
            api.run(f"for {user}", **{"cf-aig-gateway-id": "default",
                                     "cf-aig-metadata": json.dumps({"user": user, "n": 1})})
        api.stream(**{"cf-aig-gateway-id": "default"})
        rows = api.result(logs, metadata=json.dumps({"user": "alice", "n": 1}))
        assert [json.loads(r["metadata"])["user"] for r in rows] == ["alice"]
        alice = rows[0]["id"]
        assert api.result(f"{logs}/{alice}/request") == {"prompt": "for alice"}
        assert api.result(f"{logs}/{alice}/response")["result"]["response"]
        newest = api.result(logs, per_page=1)[0]["id"]
        streamed = api.result(f"{logs}/{newest}/response")
        assert streamed.startswith("data: ") and streamed.rstrip().endswith("data: [DONE]")
        bad = api.get(logs, metadata="[1]")
        assert bad.status_code == 400 and bad.json()["errors"][0]["message"] == \
            "metadata must be a JSON object of scalar values"
        assert api.get(f"{logs}/nope/request").status_code == 404


def test_a_long_body_keeps_its_head_and_says_how_much_was_cut():
    body = b"x" * (BODY_LIMIT + 10)
    assert captured_body(body).endswith("\n[truncated: 10 more bytes]")
    capture = BodyCapture()
    for i in range(0, len(body), 1000):
        capture.feed(body[i:i + 1000])
    assert capture.text() == captured_body(body)
    assert captured_body(b"short") == "short"


def test_the_dev_session_is_given_to_this_machine_only(fleet):
    gw, _ = fleet
    assert httpx.get(f"{gw.url}/dashboard/session").status_code == 404  # `start`: no session
    gw.state.dev_session = (gw.account_id, gw.token)
    session = httpx.get(f"{gw.url}/dashboard/session")
    assert session.json() == {"account_id": gw.account_id, "token": gw.token, "mode": "dev"}
    # A page on a DNS name rebound to 127.0.0.1 sends its own Host: no token for it.
    rebound = httpx.get(f"{gw.url}/dashboard/session", headers={"host": "evil.example"})
    assert rebound.status_code == 404 and rebound.json()["success"] is False


def test_the_page_and_its_assets_are_served_from_the_package(fleet):
    gw, _ = fleet
    page = httpx.get(f"{gw.url}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
    # Every asset the page names is served, from this origin: nothing from a CDN.
    assets = _asset_paths(page.text)
    assert "/dashboard/app.js" in assets
    for path in assets:
        assert httpx.get(f"{gw.url}{path}").status_code == 200, path
    for path in ("/dashboard/world-110m.json", "/dashboard/vendor/uPlot.iife.min.js"):
        assert httpx.get(f"{gw.url}{path}").status_code == 200, path
    assert httpx.get(f"{gw.url}/dashboard/nope.js").status_code == 404


def _asset_paths(html: str) -> list[str]:
    found = re.findall(r'(?:src|href)="([^"#]+)"', html)
    assert all(not url.startswith(("http:", "https:", "//")) for url in found), found
    return [url for url in found if url.startswith("/dashboard/")]
