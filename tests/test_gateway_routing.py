"""Gateway routing: geography, client location, the node directory and candidate ranking."""

from __future__ import annotations

import asyncio
import json

import pytest

from edgefire.contract.catalog import Catalog
from edgefire.contract.cities import City, all_cities, load_city
from edgefire.contract.errors import ForbiddenError, InvalidInputError
from edgefire.contract.headers import NODE_SECRET, PREFILL_NODE
from edgefire.gateway.dev import PREFILL_PORT_OFFSET, node_commands
from edgefire.gateway.routing.directory import NodeDirectory
from edgefire.gateway.routing.geo import (
    COUNTRY_CENTROIDS,
    ClientLocator,
    great_circle_km,
    latency_ms,
)
from tests.gateway_fakes import MODEL, RecordingUpstream, gateway, heartbeat

CITIES = {c.code: c for c in all_cities()}
SMALL = "@cf/huggingfacetb/smollm2-135m-instruct"
SMALL_NEED = Catalog.load().get(SMALL).need_bytes
GERMANY, BRAZIL, SINGAPORE = (COUNTRY_CENTROIDS[c] for c in ("DE", "BR", "SG"))


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def beat(city: City, **overrides) -> dict:
    payload = {
        "city": city.code, "name": city.name, "url": f"http://127.0.0.1:{city.port}",
        "lat": city.lat, "lon": city.lon, "role": city.role,
        "memory_budget_bytes": city.memory_budget_bytes,
        "accelerator_bytes": city.declared_accelerator_bytes,
        "loaded_models": {}, "running": 0, "waiting": 0, "kv_usage": 0.0,
    }
    return payload | overrides


def directory(clock: FakeClock | None = None, **per_city: dict) -> NodeDirectory:
    nodes = NodeDirectory(clock=clock or FakeClock())
    for code, city in CITIES.items():
        nodes.heartbeat(beat(city, **per_city.get(code, {})))
    return nodes


def order(nodes: NodeDirectory, location, model: str = SMALL, need: int = SMALL_NEED,
          **kwargs) -> list[str]:
    return [n.city for n in nodes.candidates(model, need, location, **kwargs)]


def loaded(model: str = SMALL) -> dict:
    return {"loaded_models": {model: {"active_requests": 0, "memory_bytes": SMALL_NEED}}}


# --- geography ---------------------------------------------------------------------------

def test_great_circle_distances() -> None:
    fra, lhr, sin = CITIES["fra"], CITIES["lhr"], CITIES["sin"]
    assert great_circle_km(fra.lat, fra.lon, lhr.lat, lhr.lon) == pytest.approx(650, rel=0.02)
    assert great_circle_km(fra.lat, fra.lon, sin.lat, sin.lon) == pytest.approx(10260, rel=0.02)
    assert great_circle_km(10, 20, 10, 20) == 0
    assert great_circle_km(0, 0, 0, 180) == pytest.approx(20015, rel=0.001)


def test_latency_grows_with_distance() -> None:
    assert latency_ms(0) == pytest.approx(2.0)
    assert 5 < latency_ms(650) < 20
    assert 100 < latency_ms(10260) < 250


def test_locate_from_headers_and_ip_map() -> None:
    locator = ClientLocator({"10.1.0.0/16": "fra", "10.1.2.3": "sin", "2001:db8::/32": "gru"},
                            {code: (c.lat, c.lon) for code, c in CITIES.items()})
    fra, sin, gru = ((CITIES[c].lat, CITIES[c].lon) for c in ("fra", "sin", "gru"))
    assert locator.locate({"x-client-geo": "48.1, 11.6"}, None) == (48.1, 11.6)
    assert locator.locate({"X-Client-Geo": "-33.9,151.2"}, "10.1.2.3") == (-33.9, 151.2)
    assert locator.locate({"cf-ipcountry": "de"}, "10.1.2.3") == GERMANY
    assert locator.locate({}, "10.1.9.9") == fra
    assert locator.locate({}, "10.1.2.3") == sin  # the longest prefix wins
    assert locator.locate({}, "2001:db8::1") == gru
    assert locator.locate({}, "192.0.2.1") is None
    assert locator.locate({}, "not-an-ip") is None
    assert locator.locate({}, None) is None
    assert ClientLocator(None, {}).locate({}, "10.1.9.9") is None


@pytest.mark.parametrize("bad", ["", "48.1", "a,b", "1,2,3", "91,0", "0,181", "nan,0", "inf,1"])
def test_bad_client_geo_is_ignored(bad: str) -> None:
    locator = ClientLocator(None, {})
    assert locator.locate({"x-client-geo": bad}, None) is None
    assert locator.locate({"x-client-geo": bad, "cf-ipcountry": "BR"}, None) == BRAZIL


def test_unknown_country_and_unknown_city() -> None:
    assert ClientLocator(None, {}).locate({"cf-ipcountry": "XX"}, None) is None
    with pytest.raises(ValueError, match="unknown city"):
        ClientLocator({"10.0.0.0/8": "nowhere"}, {})


# --- directory ---------------------------------------------------------------------------

def test_heartbeat_registers_and_refreshes() -> None:
    nodes = NodeDirectory(clock=FakeClock())
    state = nodes.heartbeat(beat(CITIES["fra"]))
    assert state.city == "fra" and state.memory_budget_bytes == CITIES["fra"].memory_budget_bytes
    assert nodes.heartbeat(beat(CITIES["fra"], waiting=3, kv_usage=0.5)) is state
    assert (state.waiting, state.kv_usage) == (3, 0.5)
    assert [n.city for n in nodes.nodes()] == ["fra"]
    view = nodes.to_json()
    json.dumps(view)
    assert view["nodes"][0]["city"] == "fra" and view["nodes"][0]["healthy"]


@pytest.mark.parametrize("change", [
    {"city": ""}, {"url": "ftp://x"}, {"lat": 91}, {"lon": "8"}, {"memory_budget_bytes": -1},
    {"memory_budget_bytes": True}, {"running": 1.5}, {"kv_usage": 2.0},
    {"loaded_models": ["a"]}, {"loaded_models": {"a": 1}},
])
def test_malformed_heartbeat_is_rejected(change: dict) -> None:
    with pytest.raises(InvalidInputError):
        NodeDirectory().heartbeat(beat(CITIES["fra"]) | change)
    with pytest.raises(InvalidInputError):
        NodeDirectory().heartbeat([])


def test_missed_heartbeats_drop_a_node_until_it_beats_again() -> None:
    clock = FakeClock()
    nodes = directory(clock)
    clock.now += 4
    for code in ("lhr", "sin", "iad", "gru"):
        nodes.heartbeat(beat(CITIES[code]))
    clock.now += 3  # fra is now 7 s silent, past the 6 s timeout
    assert "fra" not in order(nodes, GERMANY)
    assert "fra" not in [n.city for n in nodes.healthy()]
    nodes.heartbeat(beat(CITIES["fra"]))
    assert order(nodes, GERMANY)[0] == "fra"


def test_mark_failed_holds_until_a_heartbeat_after_the_cooldown() -> None:
    clock = FakeClock()
    nodes = directory(clock)
    nodes.mark_failed("fra", cooldown_s=5)
    assert "fra" not in order(nodes, GERMANY)
    clock.now += 2
    nodes.heartbeat(beat(CITIES["fra"]))  # may have been sent before the failure
    assert "fra" not in order(nodes, GERMANY)
    clock.now += 4
    assert "fra" not in order(nodes, GERMANY)  # cooldown over, but no fresh heartbeat yet
    nodes.heartbeat(beat(CITIES["fra"]))
    assert order(nodes, GERMANY)[0] == "fra"
    nodes.mark_failed("nowhere")  # an unknown node is not an error


@pytest.mark.parametrize(("location", "nearest"),
                         [(GERMANY, "fra"), (BRAZIL, "gru"), (SINGAPORE, "sin")])
def test_nearest_node_first(location, nearest: str) -> None:
    ranked = order(directory(), location)
    assert ranked[0] == nearest and sorted(ranked) == sorted(CITIES)


def test_unknown_location_prefers_loaded_then_least_busy() -> None:
    nodes = directory(sin=loaded(), fra={"running": 2}, gru={"running": 1})
    assert order(nodes, None) == ["sin", "iad", "lhr", "gru", "fra"]


def test_huge_model_only_goes_where_it_fits() -> None:
    need = 12 << 30  # over every budget but iad's 16 GiB
    assert order(directory(), SINGAPORE, model="@cf/big", need=need) == ["iad"]
    assert order(directory(), SINGAPORE, model="@cf/big", need=64 << 30) == []
    # Already resident somewhere (loaded before a budget change): that node can serve it.
    nodes = directory(sin=loaded("@cf/big"))
    assert order(nodes, SINGAPORE, model="@cf/big", need=need) == ["sin", "iad"]


def test_loaded_neighbour_beats_cold_nearest_but_not_across_continents() -> None:
    assert order(directory(lhr=loaded()), GERMANY)[0] == "lhr"
    assert order(directory(iad=loaded()), GERMANY)[0] == "fra"
    assert order(directory(iad=loaded()), BRAZIL)[0] == "gru"


def test_deep_queue_spills_over() -> None:
    nodes = directory(fra={"waiting": 8})
    ranked = order(nodes, GERMANY)
    assert ranked[0] == "lhr" and ranked[-1] == "fra"
    assert order(nodes, GERMANY, max_waiting=9)[0] == "fra"


def test_session_affinity() -> None:
    clock = FakeClock()
    nodes = directory(clock)
    s1 = ("acct-a", "s1")
    nodes.pin(*s1, "sin")
    assert order(nodes, GERMANY, session=s1)[0] == "sin"
    assert order(nodes, GERMANY, session=("acct-a", "other"))[0] == "fra"
    assert order(nodes, GERMANY)[0] == "fra"
    # Not eligible any more: too small for the model, failed, or too busy.
    assert order(nodes, GERMANY, model="@cf/big", need=12 << 30, session=s1) == ["iad"]
    nodes.heartbeat(beat(CITIES["sin"], waiting=8))
    assert order(nodes, GERMANY, session=s1)[0] == "fra"
    nodes.heartbeat(beat(CITIES["sin"]))
    nodes.mark_failed("sin")
    assert order(nodes, GERMANY, session=s1)[0] == "fra"
    nodes.pin(*s1, "lhr")  # re-pinned where it was served instead
    assert order(nodes, GERMANY, session=s1)[0] == "lhr"


def test_session_pins_are_per_account() -> None:
    nodes = directory()
    nodes.pin("acct-a", "shared-id", "sin")
    # Another account sending the same session id is routed on its own merits.
    assert order(nodes, GERMANY, session=("acct-b", "shared-id"))[0] == "fra"
    assert order(nodes, GERMANY, session=("acct-a", "shared-id"))[0] == "sin"


# --- what a heartbeat may claim -------------------------------------------------------------

@pytest.mark.parametrize(("url", "why"), [
    ("ftp://127.0.0.1:8801", "http"), ("http://", "host"), ("http://:8801", "host"),
    ("http://user:pw@127.0.0.1:8801", "user"), ("http://127.0.0.1:8801/?x=1", "query"),
    ("http://127.0.0.1:8801?", "query"), ("http://127.0.0.1:8801#top", "fragment"),
    ("http://127.0.0.1:8801/v1", "path"), ("http://127.0.0.1:0", "port"),
    ("http://127.0.0.1:65536", "port"), ("http://127.0.0.1:http", "port"),
    ("http://bad host:80", "spaces"), ("http://ex%61mple.com", "host"),
    ("http://" + "a" * 2050, "2048"),
])
def test_node_urls_are_plain_http_origins(url: str, why: str) -> None:
    with pytest.raises(InvalidInputError, match=why) as caught:
        NodeDirectory().heartbeat(beat(CITIES["fra"], url=url))
    assert caught.value.field == "url" and caught.value.code == 5006


@pytest.mark.parametrize(("url", "kept"), [
    ("http://127.0.0.1:8801/", "http://127.0.0.1:8801"),
    ("https://fra.example.net", "https://fra.example.net"),
    ("http://[::1]:8801", "http://[::1]:8801"),
])
def test_good_node_urls_are_kept_as_origins(url: str, kept: str) -> None:
    assert NodeDirectory().heartbeat(beat(CITIES["fra"], url=url)).url == kept


def test_heartbeat_sizes_are_bounded() -> None:
    many = {f"@cf/m{i}": {} for i in range(5)}
    with pytest.raises(InvalidInputError, match="more than 4") as caught:
        NodeDirectory(max_models=4).heartbeat(beat(CITIES["fra"], loaded_models=many))
    assert caught.value.field == "loaded_models"
    for change in ({"city": "x" * 65}, {"city": "fra/../x"}, {"name": "n" * 129},
                   {"role": "all"}, {"status": "fine"}, {"status": 1}):
        with pytest.raises(InvalidInputError):
            NodeDirectory().heartbeat(beat(CITIES["fra"]) | change)


def test_node_count_is_bounded_but_silent_nodes_make_room() -> None:
    clock = FakeClock()
    nodes = NodeDirectory(clock=clock, max_nodes=2)
    nodes.heartbeat(beat(CITIES["fra"]))
    nodes.heartbeat(beat(CITIES["sin"]))
    with pytest.raises(InvalidInputError, match="2 live nodes") as caught:
        nodes.heartbeat(beat(CITIES["gru"]))
    assert caught.value.field == "city"
    nodes.heartbeat(beat(CITIES["fra"], waiting=1))  # a known city still reports
    clock.now += 4
    nodes.heartbeat(beat(CITIES["fra"]))
    clock.now += 3  # sin is silent past the timeout: its slot is free
    assert nodes.heartbeat(beat(CITIES["gru"])).city == "gru"
    assert [n.city for n in nodes.nodes()] == ["fra", "gru"]


def test_a_live_city_stays_bound_to_the_credential_that_registered_it() -> None:
    clock = FakeClock()
    nodes = NodeDirectory(clock=clock)
    nodes.heartbeat(beat(CITIES["sin"]), credential="node:fra")
    with pytest.raises(ForbiddenError) as caught:
        nodes.heartbeat(beat(CITIES["sin"], url="http://203.0.113.9:80"), credential="fleet")
    assert caught.value.status == 403
    assert nodes.nodes()[0].url == f"http://127.0.0.1:{CITIES['sin'].port}"
    moved = nodes.heartbeat(beat(CITIES["sin"], url="http://127.0.0.1:9999"), "node:fra")
    assert moved.url == "http://127.0.0.1:9999"  # its own credential may move it
    clock.now += 7  # silent past the timeout: no longer live, so another credential may take it
    assert nodes.heartbeat(beat(CITIES["sin"]), credential="fleet").credential == "fleet"


def test_degraded_nodes_rank_last_and_starting_nodes_are_never_routed() -> None:
    nodes = directory(fra={"status": "degraded"}, lhr={"status": "starting"})
    ranked = order(nodes, GERMANY)
    assert ranked[-1] == "fra" and "lhr" not in ranked
    assert [n.city for n in nodes.healthy()] == ["fra", "gru", "iad", "sin"]
    # A degraded node still serves when it is the only one that can.
    only = NodeDirectory(clock=FakeClock())
    only.heartbeat(beat(CITIES["fra"], status="degraded"))
    assert order(only, GERMANY) == ["fra"]


def test_start_up_hold_ends_when_a_node_is_ready() -> None:
    async def scenario() -> tuple[bool, bool, bool]:
        nodes = NodeDirectory(clock=FakeClock(), startup_hold_s=30)
        assert nodes.starting
        nodes.heartbeat(beat(CITIES["fra"], status="starting"))  # registered, not ready
        waiter = asyncio.ensure_future(nodes.wait_until_ready())
        await asyncio.sleep(0)
        pending = not waiter.done()
        nodes.heartbeat(beat(CITIES["fra"]))
        return pending, await waiter, nodes.starting

    assert asyncio.run(scenario()) == (True, True, False)
    no_hold = NodeDirectory(startup_hold_s=0)
    assert not no_hold.starting
    assert asyncio.run(NodeDirectory(startup_hold_s=0.01).wait_until_ready()) is False


def test_the_gateway_routes_to_the_decode_pool_and_names_a_prefill_node():
    now = [0.0]
    directory = NodeDirectory(clock=lambda: now[0])

    def beat(city: str, role: str, url: str, running: int = 0, lat: float = 50.1) -> None:
        directory.heartbeat({"city": city, "url": url, "lat": lat, "lon": 8.7, "role": role,
                             "memory_budget_bytes": 1 << 33, "accelerator_bytes": 0,
                             "running": running})

    beat("fra", "decode", "http://127.0.0.1:8701")
    beat("fra", "prefill", "http://127.0.0.1:8801", running=3)
    beat("ams", "prefill", "http://127.0.0.1:8802", lat=52.4)
    beat("lhr", "both", "http://127.0.0.1:8703", lat=51.5)
    assert {n.key for n in directory.nodes()} == {"fra/decode", "fra/prefill", "ams/prefill",
                                                  "lhr"}
    candidates = directory.candidates("@cf/m", 1, (50.1, 8.7))
    assert [n.key for n in candidates] == ["fra/decode", "lhr"]  # prefill nodes take none
    # The decode node's own city first, however busy; then the nearest.
    assert directory.prefill_node("@cf/m", 1, candidates[0]).key == "fra/prefill"
    directory.mark_failed("fra/prefill")
    assert directory.prefill_node("@cf/m", 1, candidates[0]).key == "ams/prefill"
    directory.mark_failed("ams/prefill")
    assert directory.prefill_node("@cf/m", 1, candidates[0]) is None


def test_make_run_pd_starts_a_prefill_and_a_decode_node_per_city():
    commands = node_commands(["fra"], None, True)
    port = load_city("fra").port  # the decode node keeps the city's port
    assert commands == {"fra/decode": ["--city", "fra", "--role", "decode"],
                        "fra/prefill": ["--city", "fra", "--role", "prefill", "--port",
                                        str(port + PREFILL_PORT_OFFSET)]}
    assert node_commands(["fra", "lhr"], 9000, False) == {
        "fra": ["--city", "fra", "--port", "9000"], "lhr": ["--city", "lhr", "--port", "9001"]}


def test_a_decode_node_is_sent_requests_with_a_prefill_node_named(serve, tmp_path):
    decode, prefill = RecordingUpstream(), RecordingUpstream()
    with serve(decode) as decode_url, serve(prefill) as prefill_url, \
            gateway(serve, tmp_path, node_secret="s") as gw, gw.client() as client:
        assert gw.beat(heartbeat(decode_url, role="decode"), "s").status_code == 200
        assert gw.beat(heartbeat(prefill_url, role="prefill"), "s").status_code == 200
        response = client.post(f"/client/v4/accounts/{gw.account_id}/ai/run/{MODEL}",
                               json={"prompt": "hello"})
        assert response.status_code == 200, response.text
    [seen] = decode.seen
    assert seen.headers[PREFILL_NODE] == prefill_url and seen.headers[NODE_SECRET] == "s"
    assert prefill.seen == []  # prefill nodes take no requests of their own


def test_a_prefill_node_of_another_credential_is_never_named():
    directory = NodeDirectory()
    report = {"lat": 50.1, "lon": 8.7, "memory_budget_bytes": 1 << 33, "accelerator_bytes": 0}
    directory.heartbeat({"city": "fra", "url": "http://127.0.0.1:8701", "role": "decode",
                         **report}, credential="node:fra")
    directory.heartbeat({"city": "ams", "url": "http://127.0.0.1:8802", "role": "prefill",
                         **report}, credential="node:ams")
    [decode] = directory.candidates("@cf/m", 1, None)
    assert directory.prefill_node("@cf/m", 1, decode) is None  # its secret would not open it
