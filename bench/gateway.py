"""Gateway overhead: what the gateway adds to a request, and its peak rate on cached answers.

A stand-in edge node answers at once with a fixed small JSON, so the figures measure the
gateway, not a model; it and the real gateway (`edge-gateway start`) run in subprocesses.
Over HTTP/1.1 keep-alive httpx clients:
  (a) N sequential requests straight to the node and through the gateway's Workers AI REST
      route (no gateway features), interleaved so that drift hits both alike;
  (b) in the same rounds, the AI Gateway URL with caching on and a warm cache (HIT path);
  (c) C concurrent clients for a few seconds on the HIT path: the gateway's req/s.
Added latency is the gateway's percentile minus the direct one. Target: < 2 ms p50 on (b).

Run from the repository root:
  .venv/bin/python -m bench.gateway [--requests 500] [--clients 16] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from bench._common import log, machine_info, markdown_table, percentiles, rate, write_results
from bench.serve import free_port

MODEL = "@cf/huggingfacetb/smollm2-135m-instruct"
USAGE = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
ANSWER = {"result": {"response": "hi", "usage": USAGE}, "success": True, "errors": [],
          "messages": []}
_ANSWER_BYTES = json.dumps(ANSWER).encode()
BODY = json.dumps({"prompt": "Say hi", "max_tokens": 4}).encode()
TARGET_ADDED_P50_MS = 2.0
NODE_SECRET = "bench-node-secret"  # `edge-gateway start` refuses to run without one
ROOT = Path(__file__).resolve().parent.parent


def fake_node_app(seen: list[dict] | None = None, models: tuple[str, ...] = (MODEL,)) -> Starlette:
    """An edge node stand-in: ANSWER at once, or it as SSE for `stream: true`, or 5007 for a
    model not in `models`. Each request's model and JSON body are appended to `seen`."""

    async def run(request: Request) -> Response:
        model, body = request.path_params["model"], await request.json()
        if seen is not None:
            seen.append({"model": model, "body": body})
        if model not in models:
            error = {"code": 5007, "message": f"No such model {model} or task"}
            return JSONResponse({"result": None, "success": False, "errors": [error],
                                 "messages": []}, 400)
        if body.get("stream") is True:
            events = [{"response": "h"}, {"response": "i"}, {"response": "", "usage": USAGE}]
            chunks = [f"data: {json.dumps(e)}\n\n".encode() for e in events] + [b"data: [DONE]\n\n"]
            return StreamingResponse(iter(chunks), media_type="text/event-stream")
        return Response(_ANSWER_BYTES, media_type="application/json")

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[
        Route("/client/v4/accounts/{account_id}/ai/run/{model:path}", run, methods=["POST"]),
        Route("/health", health)])


def heartbeat(node_url: str, model: str = MODEL) -> dict:
    """A heartbeat registering node_url as an idle Frankfurt node that has `model` loaded."""
    return {"city": "fra", "name": "Frankfurt", "url": node_url, "lat": 50.11, "lon": 8.68,
            "memory_budget_bytes": 1 << 40, "accelerator_bytes": 0,
            "loaded_models": {model: {"active_requests": 0}}, "running": 0, "waiting": 0,
            "kv_usage": 0.0}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=500, help="sequential requests per path")
    p.add_argument("--clients", type=int, default=16, help="concurrent clients for req/s")
    p.add_argument("--seconds", type=float, default=5.0, help="length of the req/s run")
    p.add_argument("--quick", action="store_true", help="100 requests, a 2 s req/s run")
    p.add_argument("--serve", choices=["node", "gateway"], help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--limit-s", type=float, default=600.0, help=argparse.SUPPRESS)
    return p.parse_args()


def serve(role: str, port: int, limit_s: float) -> None:
    """A subprocess's server; it stops itself after limit_s should the bench not stop it."""
    timer = threading.Timer(limit_s, os.kill, (os.getpid(), signal.SIGTERM))
    timer.daemon = True
    timer.start()
    if role == "node":
        import uvicorn

        uvicorn.run(fake_node_app(), host="127.0.0.1", port=port, log_level="warning")
    else:
        from edgefire.gateway.cli import main

        main(["start", "--port", str(port)])


@contextlib.contextmanager
def subprocess_server(role: str, port: int, env: dict[str, str]) -> Iterator[psutil.Process]:
    cmd = [sys.executable, "-m", "bench.gateway", "--serve", role, "--port", str(port)]
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=errors)
        try:
            _wait_healthy(proc, f"http://127.0.0.1:{port}/health", errors)
            yield psutil.Process(proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_healthy(proc: subprocess.Popen, url: str, errors) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            # The gateway answers 503 "no_nodes" until the bench registers its node: it is up.
            if httpx.get(url, timeout=1).status_code in (200, 503):
                return
        time.sleep(0.1)
    errors.seek(0)
    tail = errors.read()[-2000:].decode(errors="replace")
    raise RuntimeError(f"{url} did not become healthy within 60 s:\n{tail}")


def interleaved(rounds: int, paths: dict[str, Callable[[], httpx.Response]],
                check: Callable[[str, httpx.Response], None]) -> dict[str, list[float]]:
    """Latency in ms of each path; every round sends one request down each path in turn."""
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(rounds):
        for name, send in paths.items():
            started = time.perf_counter()
            response = send()
            times[name].append((time.perf_counter() - started) * 1000)
            check(name, response)
    return times


async def saturate(url: str, headers: dict[str, str], clients: int, seconds: float) -> dict:
    """`clients` loops on one keep-alive pool for `seconds`: req/s and latency under load."""
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    latencies: list[float] = []
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        deadline = time.perf_counter() + seconds

        async def loop() -> None:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                (await client.post(url, content=BODY, headers=headers)).raise_for_status()
                latencies.append((time.perf_counter() - started) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(clients)))
        wall = time.perf_counter() - started
    return {"requests": len(latencies), "wall_s": round(wall, 3),
            "req_s": rate(len(latencies), wall), "latency_ms": percentiles(latencies)}


def load_run(url: str, headers: dict[str, str], server: psutil.Process,
             args: argparse.Namespace) -> dict:
    """`saturate`, and the CPU that the server and this client spent on it."""
    me = psutil.Process()
    server_before, client_before = sum(server.cpu_times()[:2]), sum(me.cpu_times()[:2])
    result = asyncio.run(saturate(url, headers, args.clients, args.seconds))
    server_s = sum(server.cpu_times()[:2]) - server_before
    client_cores = (sum(me.cpu_times()[:2]) - client_before) / result["wall_s"]
    cpu_ms = server_s * 1000 / max(1, result["requests"])
    # One process, one event loop: a core is the server's ceiling. When the client's own core
    # is full, req/s is the client's limit and this estimate is the better figure.
    return {**result, "server_cpu_cores": round(server_s / result["wall_s"], 2),
            "client_cpu_cores": round(client_cores, 2), "client_bound": client_cores > 0.9,
            "server_cpu_ms_per_request": round(cpu_ms, 3),
            "server_one_core_ceiling_req_s": round(1000 / cpu_ms) if cpu_ms else None}


def measure(node: str, gateway: str, account_id: str, token: str, args: argparse.Namespace,
            processes: dict[str, psutil.Process]) -> dict:
    httpx.post(f"{gateway}/internal/nodes/heartbeat", json=heartbeat(node),
               headers={"x-edgefire-node-secret": NODE_SECRET}).raise_for_status()
    rest = f"/client/v4/accounts/{account_id}/ai/run/{MODEL}"
    aig = f"/v1/{account_id}/default/workers-ai/{MODEL}"
    json_body = {"content-type": "application/json"}
    auth = {**json_body, "authorization": f"Bearer {token}"}
    cached = {**auth, "cf-aig-cache-ttl": "3600"}
    with httpx.Client(base_url=node, headers=json_body) as direct, \
            httpx.Client(base_url=gateway, headers=auth) as via:
        paths = {"direct": lambda: direct.post(rest, content=BODY),
                 "gateway": lambda: via.post(rest, content=BODY),
                 "cache_hit": lambda: via.post(aig, content=BODY, headers=cached)}

        def check(name: str, response: httpx.Response) -> None:
            if response.status_code != 200:
                raise RuntimeError(f"{name}: HTTP {response.status_code} {response.text[:300]}")
            if name == "cache_hit" and response.headers.get("cf-aig-cache-status") != "HIT":
                raise RuntimeError("the cache-hit path missed the cache")

        check("prime", paths["cache_hit"]())  # a MISS that fills the cache
        interleaved(50, paths, check)  # warm-up: connections, code paths
        log(f"{args.requests} interleaved rounds: direct, gateway, cache hit")
        times = interleaved(args.requests, paths, check)
    latency = {name: percentiles(values) for name, values in times.items()}
    added = {name: {q: round(latency[name][q] - latency["direct"][q], 3) for q in ("p50", "p99")}
             for name in ("gateway", "cache_hit")}
    load = {}
    for name, url, headers, server in (("direct", node + rest, json_body, "node"),
                                       ("cache_hit", gateway + aig, cached, "gateway")):
        log(f"{args.clients} clients for {args.seconds} s: {name}")
        load[name] = load_run(url, headers, processes[server], args)
    return {"bench": "gateway", "model": MODEL, "machine": machine_info(),
            "sequential": {"requests": args.requests, "latency_ms": latency, "added_ms": added},
            "concurrent": {"clients": args.clients, "seconds": args.seconds, **load},
            "target": {"cache_hit_added_p50_ms_below": TARGET_ADDED_P50_MS,
                       "met": added["cache_hit"]["p50"] < TARGET_ADDED_P50_MS}}


def table(result: dict) -> str:
    seq, load, target = result["sequential"], result["concurrent"], result["target"]
    rows = []
    for name in ("direct", "gateway", "cache_hit"):
        lat, add, run = seq["latency_ms"][name], seq["added_ms"].get(name, {}), load.get(name, {})
        rows.append([name, lat["p50"], lat["p99"], add.get("p50"), add.get("p99"),
                     run.get("req_s"), run.get("server_cpu_ms_per_request"),
                     run.get("client_cpu_cores")])
    verdict = "met" if target["met"] else "not met"
    return markdown_table(
        ["path", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms",
         f"req/s at C={load['clients']}", "server CPU ms/req", "client CPU cores"], rows) + (
        f"\n{seq['requests']} sequential requests per path. Target: cache-hit added p50 < "
        f"{target['cache_hit_added_p50_ms_below']} ms: **{verdict}**. Client CPU cores near 1: "
        "req/s is the Python client's limit; server CPU ms/req gives the gateway's own.\n")


def main() -> None:
    args = parse_args()
    if args.serve:
        serve(args.serve, args.port, args.limit_s)
        return
    if args.quick:
        args.requests, args.seconds = 100, 2.0
    from edgefire.gateway.accounts import AccountStore
    from edgefire.gateway.db import Database

    with tempfile.TemporaryDirectory() as tmp:
        db_path = Path(tmp) / "gateway.db"
        with contextlib.closing(Database(db_path)) as db:
            accounts = AccountStore(db)
            account_id = accounts.create_account("bench").id
            _, token = accounts.create_token(account_id)
        # A clean environment: a memory cache, the bench's node secret (the stand-in node
        # does not check it), and a node heartbeat that stays fresh for the whole run.
        env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEFIRE_")}
        env |= {"EDGEFIRE_GATEWAY_DB": str(db_path), "EDGEFIRE_HEARTBEAT_TIMEOUT_S": "86400",
                "EDGEFIRE_NODE_SECRET": NODE_SECRET,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))}
        node_port, gateway_port = free_port(), free_port()
        log(f"fake node on :{node_port}, gateway on :{gateway_port}")
        with subprocess_server("node", node_port, env) as node, \
                subprocess_server("gateway", gateway_port, env) as gateway:
            result = measure(f"http://127.0.0.1:{node_port}", f"http://127.0.0.1:{gateway_port}",
                             account_id, token, args, {"node": node, "gateway": gateway})
    write_results("gateway", result, table(result))


if __name__ == "__main__":
    main()
