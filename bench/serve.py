"""HTTP serving benchmark of one edge node, in the style of vLLM's benchmark_serving.

Starts `edge-node start --city fra` on a free port, then for each client count C sends
requests whose arrivals follow a Poisson process at --request-rate, with at most C in flight,
prompt and output lengths drawn from fixed ranges with a fixed seed. Streams every response
(Workers AI SSE) to time TTFT and inter-token latency, and samples the node's CPU use.

Run from the repository root: .venv/bin/python -m bench.serve [--clients 1,4,16] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from bench._common import (
    SENTENCES,
    log,
    machine_info,
    markdown_table,
    percentiles,
    rate,
    write_results,
)

MODEL = "@cf/huggingfacetb/smollm2-135m-instruct"
ROUTE = "/client/v4/accounts/bench/ai/run/" + MODEL


@dataclass(slots=True)
class RequestTrace:
    sent: float
    chunks: list[float] = field(default_factory=list)  # arrival time of each text event
    completion_tokens: int = 0
    ok: bool = False


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", default="1,4,16", help="comma list of max in-flight requests")
    p.add_argument("--requests-per-client", type=int, default=4)
    p.add_argument("--request-rate", type=float, default=8.0, help="Poisson arrivals per second")
    p.add_argument("--prompt-words", default="24,160", help="uniform range of prompt words")
    p.add_argument("--max-tokens", default="32,128", help="uniform range of max_tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="clients 1,4; 2 requests each")
    return p.parse_args()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "edgefire.edge_nodes.cli", "start", "--city", "fra",
           "--port", str(port)]
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the edge node did not become healthy within 120 s")


def make_workload(n: int, args: argparse.Namespace, rng: random.Random) -> list[dict]:
    lo_w, hi_w = map(int, args.prompt_words.split(","))
    lo_t, hi_t = map(int, args.max_tokens.split(","))
    words = " ".join(SENTENCES).split()
    body = []
    for i in range(n):
        count = rng.randint(lo_w, hi_w)
        start = rng.randrange(len(words))
        text = " ".join(words[(start + j) % len(words)] for j in range(count))
        body.append({"prompt": f"Request {i}: {text}", "raw": True, "stream": True,
                     "max_tokens": rng.randint(lo_t, hi_t), "temperature": 0.7,
                     "seed": rng.randrange(1, 10**6)})
    return body


async def one_request(client: httpx.AsyncClient, payload: dict) -> RequestTrace:
    trace = RequestTrace(sent=time.perf_counter())
    async with client.stream("POST", ROUTE, json=payload) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("response"):
                trace.chunks.append(time.perf_counter())
            if "usage" in event:
                trace.completion_tokens = event["usage"]["completion_tokens"]
        trace.ok = response.status_code == 200
    return trace


async def run_level(base: str, clients: int, workload: list[dict], request_rate: float,
                    rng: random.Random) -> tuple[list[RequestTrace], float]:
    limit = asyncio.Semaphore(clients)

    async def gated(payload: dict) -> RequestTrace:
        async with limit:
            return await one_request(client, payload)

    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        started = time.perf_counter()
        tasks = []
        for payload in workload:
            tasks.append(asyncio.create_task(gated(payload)))
            await asyncio.sleep(rng.expovariate(request_rate))
        traces = await asyncio.gather(*tasks)
        return traces, time.perf_counter() - started


def summarise(clients: int, traces: list[RequestTrace], wall: float, cpu_s: float) -> dict:
    ok = [t for t in traces if t.ok]
    ttft = [t.chunks[0] - t.sent for t in ok if t.chunks]
    itl = [b - a for t in ok for a, b in zip(t.chunks, t.chunks[1:], strict=False)]
    tokens = sum(t.completion_tokens for t in ok)
    return {
        "clients": clients, "requests": len(traces), "failed": len(traces) - len(ok),
        "wall_s": round(wall, 3), "req_s": rate(len(ok), wall), "output_tok_s": rate(tokens, wall),
        "ttft_ms": percentiles(ttft, 1000), "itl_ms": percentiles(itl, 1000),
        "node_cpu_cores": round(cpu_s / wall, 2) if wall else None,
    }


def main() -> None:
    args = parse_args()
    levels = [1, 4] if args.quick else [int(c) for c in args.clients.split(",")]
    per_client = 2 if args.quick else args.requests_per_client
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log(f"starting edge node fra on :{port}")
    node = start_node(port)
    try:
        node_ps = psutil.Process(node.pid)
        httpx.post(base + ROUTE, json={"prompt": "warm up", "max_tokens": 4}, timeout=300)
        rng = random.Random(args.seed)
        results = []
        for clients in levels:
            workload = make_workload(max(8, clients * per_client), args, rng)
            cpu_before = sum(node_ps.cpu_times()[:2])
            traces, wall = asyncio.run(run_level(base, clients, workload, args.request_rate, rng))
            summary = summarise(clients, traces, wall, sum(node_ps.cpu_times()[:2]) - cpu_before)
            log(f"C={clients}: {summary}")
            results.append(summary)
    finally:
        node.terminate()
        node.wait(timeout=30)
    rows = [[r["clients"], r["requests"], r["req_s"], r["output_tok_s"],
             f"{r['ttft_ms']['p50']} / {r['ttft_ms']['p99']}",
             f"{r['itl_ms']['p50']} / {r['itl_ms']['p99']}", r["node_cpu_cores"]] for r in results]
    table = markdown_table(["clients", "requests", "req/s", "output tok/s", "TTFT p50/p99 ms",
                            "ITL p50/p99 ms", "node CPU (cores)"], rows)
    write_results("serve", {
        "bench": "serve", "model": MODEL, "machine": machine_info(),
        "workload": {"request_rate": args.request_rate, "prompt_words": args.prompt_words,
                     "max_tokens": args.max_tokens, "seed": args.seed, "temperature": 0.7},
        "levels": results,
    }, table)


if __name__ == "__main__":
    main()
