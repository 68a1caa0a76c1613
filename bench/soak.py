"""Soak test of `make run`'s fleet: many clients for a long time, a mixed and hostile workload.

N clients (default 64) send, for --duration seconds (default 600), a mix of Workers AI chat
(messages and prompt, with and without penalties), streams, OpenAI chat, embeddings, gateway
cache hits, client disconnects mid-stream and mid-request, and bad inputs (bench/soak_mix.py).
By default it starts its own fleet (`edge-gateway dev` in a temporary directory, on free
ports); --attach uses a running one. Every request goes to 127.0.0.1 and is bounded in time.

Reports status counts and latency percentiles per kind, the node's KV blocks in use before and
after (after waiting for the node to go idle), and the node's RSS growth after a warm-up. Exits
1 unless: no unexpected 5xx (nor dropped connections or broken streams), no request left
unanswered, KV blocks back to their baseline, node RSS growth < 5% after warm-up.

Run from the repository root: .venv/bin/python -m bench.soak [--clients 64] [--duration 600]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

from bench._common import log, machine_info, markdown_table, percentiles, rate, write_results
from bench.soak_fleet import Fleet, attached_fleet, node_load, private_fleet, rss_mib, warm_up
from bench.soak_mix import MIX, Client, Outcome

RSS_GROWTH_LIMIT_PCT = 5.0
MAX_CLIENTS = 512
SAMPLES_KEPT = 25  # unexpected outcomes quoted in the result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    p.add_argument("--warmup", type=float, default=None,
                   help="seconds of load before the RSS baseline (default: duration/5, ≤ 60)")
    p.add_argument("--request-timeout", type=float, default=120.0)
    p.add_argument("--settle-timeout", type=float, default=120.0,
                   help="how long to wait for the node to go idle after the load")
    p.add_argument("--city", default="fra")
    p.add_argument("--attach", metavar="GATEWAY_URL", help="use a running fleet (make run)")
    p.add_argument("--dev-file", type=Path, default=Path(".edgefire/dev.json"),
                   help="with --attach: the dev account (and admin token) of that fleet")
    p.add_argument("--node-url", help="with --attach: the node's URL (default: from the "
                   "gateway's directory, else the city's port)")
    p.add_argument("--exclude", default="", help="comma list of request kinds to leave out "
                   f"(of: {', '.join(kind.__name__ for kind, _ in MIX)})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", type=Path, help="write the JSON here instead of bench/results")
    args = p.parse_args(argv)
    if not 1 <= args.clients <= MAX_CLIENTS or args.duration <= 0:
        p.error(f"--clients must be 1..{MAX_CLIENTS} and --duration positive")
    args.mix = tuple((k, w) for k, w in MIX if k.__name__ not in args.exclude.split(","))
    if not args.mix:
        p.error("--exclude leaves no request kind")
    if args.warmup is None:
        args.warmup = min(60.0, args.duration / 5)
    return args


async def _client_loop(index: int, client: Client, mix: tuple, deadline: float,
                       out: list[Outcome]) -> None:
    """Client `index` starts with kind `index` of the mix (so that, with as many clients as
    kinds, each kind is sent even in a short run), then draws kinds by weight. At the deadline
    it leaves with its request in flight (`cut_at_end`): the load ends on time, and with a
    burst of disconnects whose KV blocks the node must free too."""
    kinds, weights = zip(*mix, strict=True)
    kind = kinds[index % len(kinds)]
    while (left := deadline - time.monotonic()) > 0:
        try:
            out.append(await asyncio.wait_for(kind(client), left))
        except TimeoutError:
            out.append(Outcome(kind.__name__, "cut_at_end", None, True, False))
            return
        kind = client.rng.choices(kinds, weights)[0]


async def _sample_rss(pid: int | None, samples: list[tuple[float, float]], stop: asyncio.Event,
                      every_s: float = 1.0) -> None:
    started = time.monotonic()
    while not stop.is_set():
        value = rss_mib(pid)
        if value is not None:
            samples.append((time.monotonic() - started, value))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


async def _load(fleet: Fleet, args: argparse.Namespace) -> tuple[list[Outcome], dict, float]:
    outcomes: list[Outcome] = []
    node_rss: list[tuple[float, float]] = []
    gateway_rss: list[tuple[float, float]] = []
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=args.clients + 8, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(base_url=fleet.gateway_url, limits=limits, trust_env=False,
                                 headers={"authorization": f"Bearer {fleet.token}"},
                                 timeout=args.request_timeout) as http:
        samplers = [asyncio.create_task(_sample_rss(fleet.node_pid, node_rss, stop)),
                    asyncio.create_task(_sample_rss(fleet.gateway_pid, gateway_rss, stop))]
        started = time.monotonic()
        deadline = started + args.duration
        clients = [Client(http, fleet.account, random.Random(args.seed * 10_007 + i),
                          args.request_timeout) for i in range(args.clients)]
        await asyncio.gather(*(_client_loop(i, c, args.mix, deadline, outcomes)
                               for i, c in enumerate(clients)))
        wall = time.monotonic() - started
        stop.set()
        await asyncio.gather(*samplers)
    rss = {"node": _rss_summary(node_rss, args.warmup),
           "gateway": _rss_summary(gateway_rss, args.warmup)}
    return outcomes, rss, wall


def _rss_summary(samples: list[tuple[float, float]], warmup_s: float,
                 points: int = 20) -> dict:
    """RSS after warm-up, at the end, and the growth between; a coarse timeline (every
    1/points of the run) shows whether it levels off or keeps climbing."""
    if not samples:
        return {"after_warmup": None, "end": None, "max": None, "growth_pct": None}
    after = next((v for t, v in samples if t >= warmup_s), samples[-1][1])
    end = samples[-1][1]
    step = max(1, len(samples) // points)
    return {"after_warmup": after, "end": end, "max": max(v for _, v in samples),
            "growth_pct": round((end - after) / after * 100, 2),
            "timeline": [[round(t), v] for t, v in samples[::step]]}


def _settle(fleet: Fleet, baseline: int, timeout_s: float,
            idle_grace_s: float = 5.0) -> tuple[int, float, bool]:
    """(KV blocks in use, seconds waited, idle) once the node is back at baseline, or has run
    nothing for idle_grace_s (blocks still held then are leaked), or at the timeout (a node
    still busy then has requests stuck: their blocks count as leaked too)."""
    started = time.monotonic()
    idle_since = None
    while True:
        load = node_load(fleet.node_url)
        now = time.monotonic()
        idle = load.running == 0 and load.waiting == 0
        idle_since = (idle_since or now) if idle else None
        if (idle and load.kv_blocks_in_use <= baseline) or now - started > timeout_s \
                or (idle_since is not None and now - idle_since >= idle_grace_s):
            return load.kv_blocks_in_use, round(now - started, 1), idle
        time.sleep(0.5)


def summarise(outcomes: list[Outcome]) -> dict:
    kinds: dict[str, dict] = {}
    for name in sorted({o.kind for o in outcomes}):
        mine = [o for o in outcomes if o.kind == name]
        entry = {
            "count": len(mine),
            "statuses": dict(Counter(o.status for o in mine).most_common()),
            "unexpected": dict(Counter(o.status for o in mine if not o.expected).most_common()),
            "latency_s": percentiles([o.latency_s for o in mine if o.latency_s is not None],
                                     points=(50, 90, 99)),
        }
        cache = Counter(o.cache for o in mine if o.cache)
        if cache:
            entry["cache"] = dict(cache)
        kinds[name] = entry
    return kinds


def verdict(outcomes: list[Outcome], leaked: int, node_rss: dict) -> dict[str, bool]:
    growth = node_rss["growth_pct"]
    return {
        "no_unexpected_5xx": not any(o.server_failure for o in outcomes),
        "no_unanswered_requests": not any(o.status == "timeout" for o in outcomes),
        "no_kv_leak": leaked == 0,
        "rss_growth_under_5pct": growth is not None and growth < RSS_GROWTH_LIMIT_PCT,
    }


def soak(fleet: Fleet, args: argparse.Namespace) -> dict:
    before = node_load(fleet.node_url)
    log(f"node idle: {before.kv_blocks_in_use} KV blocks in use; load for {args.duration:.0f}s "
        f"with {args.clients} clients")
    outcomes, rss, wall = asyncio.run(_load(fleet, args))
    log(f"{len(outcomes)} requests in {wall:.1f}s; waiting for the node to go idle")
    after, settle_s, idle = _settle(fleet, before.kv_blocks_in_use, args.settle_timeout)
    log(f"node {'idle' if idle else 'STILL BUSY'} after {settle_s}s: {after} KV blocks in use")
    leaked = max(0, after - before.kv_blocks_in_use)
    checks = verdict(outcomes, leaked, rss["node"])
    odd = [o for o in outcomes if not o.expected or o.envelope_ok is False]
    samples = {}  # the first of each (kind, case, status)
    for o in odd:
        samples.setdefault(f"{o.kind}{'/' + o.case if o.case else ''} → {o.status}", o.detail)
    return {
        "bench": "soak", "machine": machine_info(),
        "config": {"clients": args.clients, "duration_s": args.duration,
                   "warmup_s": args.warmup, "request_timeout_s": args.request_timeout,
                   "city": args.city, "seed": args.seed, "attached": not fleet.started,
                   "mix": {kind.__name__: weight for kind, weight in args.mix}},
        "requests": len(outcomes), "wall_s": round(wall, 1), "req_s": rate(len(outcomes), wall),
        "server_failures": sum(o.server_failure for o in outcomes),
        "errors_outside_envelope": sum(o.envelope_ok is False for o in outcomes),
        "kinds": summarise(outcomes),
        "unexpected": dict(Counter(f"{o.kind}{'/' + o.case if o.case else ''} → {o.status}"
                                   for o in odd).most_common()),
        "unexpected_samples": dict(list(samples.items())[:SAMPLES_KEPT]),
        "kv_blocks": {"before": before.kv_blocks_in_use, "after": after, "leaked": leaked,
                      "node_idle": idle, "settle_s": settle_s},
        "rss_mib": rss, "checks": checks, "verdict": "pass" if all(checks.values()) else "fail",
    }


def _markdown(result: dict) -> str:
    rows = [[name, k["count"], ", ".join(f"{s}: {n}" for s, n in k["statuses"].items()),
             ", ".join(f"{s}: {n}" for s, n in k["unexpected"].items()) or "–",
             k["latency_s"]["p50"], k["latency_s"]["p90"], k["latency_s"]["p99"]]
            for name, k in result["kinds"].items()]
    table = markdown_table(["kind", "requests", "statuses", "unexpected", "p50 s", "p90 s",
                            "p99 s"], rows)
    kv, node = result["kv_blocks"], result["rss_mib"]["node"]
    return (table + f"\nKV blocks in use: {kv['before']} before, {kv['after']} after "
            f"(leaked {kv['leaked']}). Node RSS: {node['after_warmup']} MiB after warm-up, "
            f"{node['end']} MiB at the end ({node['growth_pct']}%). Verdict: "
            f"{result['verdict']} {result['checks']}\n")


def run(args: argparse.Namespace) -> dict:
    if args.attach:
        fleet = attached_fleet(args.attach, args.dev_file, args.node_url, args.city)
        warm_up(fleet)
        return soak(fleet, args)
    with private_fleet(args.city) as fleet:
        log(f"fleet up: gateway {fleet.gateway_url}, node {fleet.node_url} "
            f"(pid {fleet.node_pid})")
        warm_up(fleet)
        return soak(fleet, args)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    if args.output is not None:
        args.output.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result), flush=True)
    else:
        write_results("soak", result, _markdown(result))
    log(f"verdict: {result['verdict']} {result['checks']}")
    return 0 if result["verdict"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
