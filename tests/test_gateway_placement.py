"""Placement over real HTTP: a gateway in front of one fake node per city sends a big model to
the nearest live city whose declared accelerators the capacity planner says can host its real
config, small models to the nearest city; a model no live city can host is a clear 5018 naming
why (never 429), or the stand-in's answer when one is set; the fleet view carries the
planner's verdicts."""

from __future__ import annotations

import contextlib

import pytest
import yaml

from edgefire.contract.catalog import DEFAULT_CATALOG, Catalog
from edgefire.contract.cities import City, all_cities
from edgefire.contract.errors import HostsOfflineError, NoHostError
from edgefire.contract.headers import STAND_IN
from edgefire.gateway.routing.directory import NodeDirectory
from edgefire.gateway.routing.placement import Placement
from tests.gateway_fake_models import ModelUpstream
from tests.gateway_fakes import gateway

KIMI = "@cf/moonshotai/kimi-k2.5"
SCOUT = "@cf/meta/llama-4-scout-17b-16e-instruct"
SMOL = "@cf/huggingfacetb/smollm2-135m-instruct"
MINILM = "@cf/sentence-transformers/all-minilm-l6-v2"
SECRET = "s"
CITIES = {c.code: c for c in all_cities()}
# A miniature as the architecture helpers' catalog entries carry one (its size is the node's
# need here; placement reads only the real config).
KIMI_MINI = {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "q_lora_rank": 16,
             "kv_lora_rank": 32, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
             "v_head_dim": 8, "intermediate_size": 128, "moe_intermediate_size": 32,
             "n_routed_experts": 16, "num_experts_per_tok": 4, "vocab_size": 512, "seed": 0}
SCOUT_MINI = {"num_layers": 4, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2,
              "head_dim": 16, "intermediate_size": 64, "intermediate_size_mlp": 128,
              "vocab_size": 512, "attention_chunk_size": 32, "seed": 0}


def where(code: str) -> dict[str, str]:
    city = CITIES[code]
    return {"x-client-geo": f"{city.lat},{city.lon}"}


def beat(city: City, url: str, **extra) -> dict:
    a = city.accelerators
    return {"city": city.code, "url": url, "lat": city.lat, "lon": city.lon,
            "memory_budget_bytes": city.memory_budget_bytes,
            "accelerator_bytes": city.declared_accelerator_bytes,
            "accelerators": {"kind": a.kind, "count": a.count}, "loaded_models": {}} | extra


@pytest.fixture
def catalog_path(tmp_path):
    """The real catalog with Kimi K2.5 and Scout runnable as miniatures."""
    data = yaml.safe_load(DEFAULT_CATALOG.read_text())
    for entry in data["models"]:
        mini = {KIMI: KIMI_MINI, SCOUT: SCOUT_MINI}.get(entry["id"])
        if mini:
            entry.update(runnable=True, weights="miniature://seed", miniature=mini)
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def fleet(serve, tmp_path, catalog_path):
    """fleet(*codes, **settings) -> (gateway, {code: fake node}): those cities beat."""
    with contextlib.ExitStack() as stack:
        def start(*codes: str, **settings) -> tuple:
            gw = stack.enter_context(gateway(serve, tmp_path, node_secret=SECRET,
                                             catalog=catalog_path,
                                             **{"stand_in_model": None, **settings}))
            nodes = {}
            for code in codes:
                nodes[code] = ModelUpstream()
                url = stack.enter_context(serve(nodes[code]))
                gw.beat(beat(CITIES[code], url), SECRET).raise_for_status()
            return gw, nodes

        yield start


def run(gw, model: str, near: str):
    with gw.client() as client:
        return client.post(f"/client/v4/accounts/{gw.account_id}/ai/run/{model}",
                           json={"prompt": "Hi"}, headers=where(near))


def test_big_models_go_to_the_nearest_city_that_can_host_them(fleet):
    gw, nodes = fleet(*CITIES)
    cases = [(KIMI, "lhr", "fra"),  # only Frankfurt's 8×H100 hosts Kimi K2.5
             (KIMI, "sin", "fra"),
             (SCOUT, "gru", "iad"),  # São Paulo's L4 cannot; Ashburn's 2×H200 is nearest
             (SCOUT, "sin", "sin"),
             (SCOUT, "lhr", "fra"),  # 8×H100 hosts Scout too, and is nearer than iad
             (SMOL, "gru", "gru"),  # small models: the nearest city
             (SMOL, "lhr", "lhr")]
    for model, near, expected in cases:
        answer = run(gw, model, near)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-edgefire-node"] == expected, (model, near)


def test_a_model_only_an_offline_city_can_host_is_a_clear_5018_never_429(fleet):
    gw, nodes = fleet("lhr", "gru", "sin")
    answer = run(gw, KIMI, "lhr")
    # Frankfurt (edge_nodes/fra.yaml) could host it but sends no heartbeat: retry later.
    assert answer.status_code == 503
    error = answer.json()["errors"][0]
    assert error["code"] == 5018
    message = error["message"]
    assert message.startswith(f"{KIMI} can be hosted only by fra, offline now; no live city's")
    assert "1×L4 (gru, lhr): weights need" in message and "2×H200 (sin)" in message
    assert "it needs 8×A100 or 8×H100 or 8×H200" in message
    assert "EDGEFIRE_STAND_IN_MODEL" in message
    assert not any(node.seen for node in nodes.values())
    assert run(gw, SCOUT, "lhr").headers["x-edgefire-node"] == "sin"  # it can, far away


def test_with_a_stand_in_such_a_model_is_answered_by_it(fleet):
    gw, nodes = fleet("lhr", "gru", stand_in_model=SMOL)
    answer = run(gw, KIMI, "lhr")
    assert answer.status_code == 200 and answer.headers[STAND_IN] == SMOL
    assert answer.headers["x-edgefire-node"] == "lhr"
    assert nodes["lhr"].seen[-1].path.endswith(f"/ai/run/{SMOL}")


def test_the_fleet_view_carries_the_planners_verdicts(fleet):
    gw, _ = fleet("fra", "lhr")
    with gw.client() as client:
        view = client.get(f"/client/v4/accounts/{gw.account_id}/ai/fleet").json()["result"]
    rows = {row["code"]: {h["model"]: h for h in row["hosts"]} for row in view["cities"]}
    fra, lhr = rows["fra"][KIMI], rows["lhr"][KIMI]
    assert fra["verdict"] == "fits" and fra["planner"]["may_host"]
    assert fra["planner"]["gpus"] == "8×H100" and fra["planner"]["kv_tokens"] > 100_000
    assert lhr["verdict"] == "too_big" and not lhr["planner"]["may_host"]
    assert lhr["planner"]["reason"].startswith("weights need")
    assert lhr["need_bytes"] == fra["need_bytes"] > 0  # the miniature's, on this machine
    llama = rows["lhr"]["@cf/meta/llama-3.1-8b-instruct"]
    assert llama["verdict"] == "planning_only" and llama["planner"]["may_host"]
    accelerators = {row["code"]: row["accelerators"] for row in view["cities"]}
    assert accelerators["fra"] == {"kind": "nvidia-h100", "count": 8, "memory_gib": 79.6}


# --- the placement rule without HTTP ------------------------------------------------------

class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def _catalog(path) -> Catalog:
    return Catalog.load(path)


def test_when_the_only_hosts_are_offline_the_error_is_a_503_naming_them(catalog_path):
    catalog, clock = _catalog(catalog_path), Clock()
    directory = NodeDirectory(clock=clock, heartbeat_timeout_s=6)
    for code in ("fra", "lhr"):
        directory.heartbeat(beat(CITIES[code], f"http://127.0.0.1:{CITIES[code].port}"))
    placement = Placement()
    kimi = catalog.get(KIMI)
    assert placement.refusal(kimi, directory) is None  # fra is live
    clock.now += 10
    directory.heartbeat(beat(CITIES["lhr"], "http://127.0.0.1:8702"))
    refusal = placement.refusal(kimi, directory)
    assert isinstance(refusal, HostsOfflineError) and refusal.status == 503
    assert refusal.code == 5018 and "only by fra, offline now" in refusal.message


def test_a_node_that_declares_nothing_is_placed_by_budget_and_an_unknown_kind_hosts_nothing(
        catalog_path):
    catalog = _catalog(catalog_path)
    directory = NodeDirectory(clock=Clock())
    plain = beat(CITIES["lhr"], "http://127.0.0.1:8702")
    del plain["accelerators"]
    directory.heartbeat(plain)
    placement = Placement()
    node = directory.healthy()[0]
    assert node.accelerators is None and placement.may_host(catalog.get(KIMI), node)
    directory.heartbeat({**plain, "accelerators": {"kind": "nvidia-x9", "count": 4}})
    assert not placement.may_host(catalog.get(MINILM), node)
    assert isinstance(placement.refusal(catalog.get(MINILM), directory), HostsOfflineError)
    alone = Placement(cities=[])  # no other city declared: none in the fleet can host it
    refusal = alone.refusal(catalog.get(MINILM), directory)
    assert isinstance(refusal, NoHostError) and refusal.status == 400
    assert refusal.message.startswith(f"{MINILM} cannot be hosted by any city of the fleet")
    assert "4×nvidia-x9 (lhr): unknown accelerator 'nvidia-x9'" in refusal.message


def test_embeddings_refused_by_placement_are_5018_not_429(fleet, serve):
    gw, _ = fleet()
    node = ModelUpstream()
    with serve(node) as url:
        payload = beat(CITIES["lhr"], url, accelerators={"kind": "nvidia-x9", "count": 1})
        gw.beat(payload, SECRET).raise_for_status()
        with gw.client() as client:
            answer = client.post(f"/client/v4/accounts/{gw.account_id}/ai/run/{MINILM}",
                                 json={"text": "hi"})
    # The other cities' YAMLs declare GPUs that could host it: 503, retry later.
    assert answer.status_code == 503 and answer.json()["errors"][0]["code"] == 5018
    assert "unknown accelerator" in answer.json()["errors"][0]["message"]
    assert not node.seen
