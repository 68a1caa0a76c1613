"""Prefill/decode disaggregation and cross-node prefix reuse, on the same two cores.

1. Mixed workload: a steady stream of decoding requests (short prompts, long answers) while
   long prompts arrive. Colocated: one `both` node on both cores. Disaggregated: a prefill
   node pinned to core 0 and a decode node pinned to core 1 (`taskset`, one thread each);
   every request goes to the decode node, which hands its prompt to the prefill node
   (x-edgefire-prefill-node, as the gateway names it) and gets the pages back in the answer.
   Reported: TTFT and inter-token latency p50/p99 of the decoding requests, TTFT of the long
   prompts, and total output tok/s. Infire reports ~3x lower p90 time per token with PD.
2. Remote prefix reuse: node A (kv_backend redis) computes a long shared prefix; node B
   (redis) then answers a prompt on it from the store's pages, node C (local_paged) computes
   it. Reported: their times to first token (max_tokens 1) and the ratio, with pages stored
   as they are and through the bf16_planes KV codec (with its bytes saved).

Every request is greedy over the Workers AI REST API. Run from the repository root:
  .venv/bin/python -m bench.disagg [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis

from bench._common import (
    SENTENCES,
    log,
    machine_info,
    markdown_table,
    percentiles,
    rate,
    write_results,
)
from bench._common import ratio as ratio_of
from bench.serve_peer import RequestTrace, free_port, record_stream, wait_healthy

MODEL = "@cf/huggingfacetb/smollm2-135m-instruct"
ROUTE = "/client/v4/accounts/bench/ai/run/" + MODEL
SECRET = "bench-disagg"
ROOT = Path(__file__).resolve().parent.parent


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=60.0, help="seconds of mixed workload")
    p.add_argument("--decoders", type=int, default=4, help="decoding requests kept in flight")
    p.add_argument("--decode-words", type=int, default=24)
    p.add_argument("--decode-max-tokens", type=int, default=96)
    p.add_argument("--long-words", type=int, default=1280, help="about 1,500 tokens")
    p.add_argument("--long-every", type=float, default=4.0, help="seconds between long prompts")
    p.add_argument("--long-max-tokens", type=int, default=8)
    p.add_argument("--reuse-trials", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="20 s of mixed load, 2 reuse trials")
    return p.parse_args()


@dataclass(slots=True)
class Trace(RequestTrace):
    kind: str = "decode"  # decode | long


def start_node(port: int, role: str, cores: str | None, kv_backend: str = "local_paged",
               store_prefix: str = "", codec: str = "identity") -> subprocess.Popen:
    env = {**os.environ, "EDGEFIRE_NODE_SECRET": SECRET, "EDGEFIRE_ROLE": role,
           "EDGEFIRE_KV_BACKEND": kv_backend, "EDGEFIRE_KV_STORE_CODEC": codec,
           "EDGEFIRE_KV_STORE_PREFIX": store_prefix or f"edgefire-bench:{uuid.uuid4().hex}"}
    cmd = [sys.executable, "-m", "edgefire.edge_nodes.cli", "start", "--city", "fra",
           "--port", str(port)]
    if cores is not None:  # pinned: as many threads as cores
        env["OMP_NUM_THREADS"] = str(len(cores.split(",")))
        cmd = ["taskset", "-c", cores, *cmd]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_healthy(proc, f"http://127.0.0.1:{port}/health", f"the {role} node")
    return proc


def stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=30)


def drop_store(prefix: str) -> None:
    """Delete a run's pages from the shared Redis (they would stay until their TTL)."""
    with redis.Redis.from_url(os.environ.get("EDGEFIRE_REDIS_URL",
                                             "redis://127.0.0.1:6379/0")) as client:
        for key in client.scan_iter(match=prefix + ":*", count=1000):
            client.unlink(key)


def text(words: int, tag: str) -> str:
    pool = " ".join(SENTENCES).split()
    offset = zlib.crc32(tag.encode()) % len(pool)
    return f"Document {tag}. " + " ".join(pool[(offset + i) % len(pool)] for i in range(words))


async def send(client: httpx.AsyncClient, kind: str, prompt: str, max_tokens: int,
               headers: dict[str, str]) -> Trace:
    trace = Trace(sent=time.perf_counter(), kind=kind)
    body = {"prompt": prompt, "raw": True, "stream": True, "max_tokens": max_tokens,
            "temperature": 0}
    async with client.stream("POST", ROUTE, json=body, headers=headers) as response:
        await record_stream(response, trace)
    return trace


async def mixed(base: str, prefill_url: str | None, args: argparse.Namespace, tag: str
                ) -> tuple[list[Trace], float]:
    headers = {"x-edgefire-node-secret": SECRET}
    if prefill_url:
        headers["x-edgefire-prefill-node"] = prefill_url
    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        started = time.perf_counter()
        deadline = started + args.duration

        async def decoder(d: int) -> list[Trace]:
            out, i = [], 0
            while time.perf_counter() < deadline:
                out.append(await send(client, "decode", text(args.decode_words, f"{tag}-d{d}-{i}"),
                                      args.decode_max_tokens, headers))
                i += 1
            return out

        async def long_prompts() -> list[Trace]:
            tasks, k = [], 0
            while time.perf_counter() < deadline:
                tasks.append(asyncio.create_task(send(
                    client, "long", text(args.long_words, f"{tag}-long-{k}"),
                    args.long_max_tokens, headers)))
                k += 1
                await asyncio.sleep(args.long_every)
            return list(await asyncio.gather(*tasks))

        groups = await asyncio.gather(*(decoder(d) for d in range(args.decoders)),
                                      long_prompts())
        return [t for g in groups for t in g], time.perf_counter() - started


def summarise(traces: list[Trace], wall: float) -> dict:
    decode = [t for t in traces if t.kind == "decode" and t.ok and t.chunks]
    long = [t for t in traces if t.kind == "long" and t.ok and t.chunks]
    itl = [b - a for t in decode for a, b in zip(t.chunks, t.chunks[1:], strict=False)]
    tokens = sum(t.completion_tokens for t in traces if t.ok)
    return {
        "requests": len(traces), "failed": sum(not t.ok for t in traces),
        "decode_requests": len(decode), "long_requests": len(long), "wall_s": round(wall, 2),
        "output_tok_s": rate(tokens, wall),
        "decode_ttft_ms": percentiles([t.chunks[0] - t.sent for t in decode], 1000),
        "decode_itl_ms": {**percentiles(itl, 1000, (50, 90, 99, 99.9)),
                          "max": round(max(itl, default=0) * 1000, 1)},
        "long_ttft_ms": percentiles([t.chunks[0] - t.sent for t in long], 1000),
    }


def warm(base: str, headers: dict[str, str]) -> None:
    body = {"prompt": text(200, f"warm-{uuid.uuid4().hex}"), "raw": True, "max_tokens": 4}
    httpx.post(base + ROUTE, json=body, headers={"x-edgefire-node-secret": SECRET, **headers},
               timeout=300).raise_for_status()


def run_colocated(args: argparse.Namespace) -> dict:
    port = free_port()
    node = start_node(port, "both", None)
    try:
        warm(f"http://127.0.0.1:{port}", {})
        traces, wall = asyncio.run(mixed(f"http://127.0.0.1:{port}", None, args, "colo"))
    finally:
        stop(node)
    return summarise(traces, wall)


def run_disaggregated(args: argparse.Namespace, kv_backend: str) -> dict:
    """Pages in the prefill node's answer (local_paged) or through Redis (redis)."""
    prefill_port, decode_port = free_port(), free_port()
    store = f"edgefire-bench:{uuid.uuid4().hex}"
    prefill = start_node(prefill_port, "prefill", "0", kv_backend, store)
    decode = start_node(decode_port, "decode", "1", kv_backend, store)
    prefill_url = f"http://127.0.0.1:{prefill_port}"
    try:
        warm(f"http://127.0.0.1:{decode_port}", {"x-edgefire-prefill-node": prefill_url})
        traces, wall = asyncio.run(mixed(f"http://127.0.0.1:{decode_port}", prefill_url, args,
                                         f"pd-{kv_backend}"))
        metrics = httpx.get(f"http://127.0.0.1:{decode_port}/metrics").text
    finally:
        stop(prefill, decode)
        drop_store(store)
    summary = summarise(traces, wall)
    summary["handoffs"] = {line.split('outcome="')[1].split('"')[0]: float(line.rsplit(" ")[1])
                           for line in metrics.splitlines()
                           if line.startswith("edgefire_prefill_handoffs_total{")}
    return summary


def first_token_s(base: str, prompt: str) -> tuple[float, int, int]:
    started = time.perf_counter()
    response = httpx.post(base + ROUTE, json={"prompt": prompt, "raw": True, "max_tokens": 1},
                          headers={"x-edgefire-node-secret": SECRET}, timeout=300)
    response.raise_for_status()
    usage = response.json()["result"]["usage"]
    return (time.perf_counter() - started, usage["prompt_tokens"],
            usage["prompt_tokens_details"]["cached_tokens"])


def store_counter(base: str, name: str) -> float:
    """A node's edgefire_kv_store_<name>_total."""
    for line in httpx.get(base + "/metrics").text.splitlines():
        if line.startswith(f"edgefire_kv_store_{name}_total{{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def settle(base: str) -> None:
    """Until node A's writes to the store stop rising (its writer runs after the answer)."""
    last, deadline = -1.0, time.monotonic() + 30
    while time.monotonic() < deadline:
        now = store_counter(base, "pages_written")
        if now == last:
            return
        last = now
        time.sleep(0.3)


CODECS = ("identity", "bf16_planes")  # the KV codecs pages are stored through


def run_reuse(args: argparse.Namespace) -> dict:
    """Per codec, a writer node A and a reader node B on one store; C computes alone."""
    prefixes = {codec: f"edgefire-bench:{uuid.uuid4().hex}" for codec in CODECS}
    nodes, pairs = [], {}
    try:
        for codec in CODECS:
            ports = free_port(), free_port()
            nodes += [start_node(p, "both", None, "redis", prefixes[codec], codec)
                      for p in ports]
            pairs[codec] = tuple(f"http://127.0.0.1:{p}" for p in ports)
        c_port = free_port()
        nodes.append(start_node(c_port, "both", None))
        c = f"http://127.0.0.1:{c_port}"
        for base in (*(u for pair in pairs.values() for u in pair), c):
            warm(base, {})
        trials = []
        for i in range(args.reuse_trials):
            shared = text(args.long_words, f"reuse-{i}-{uuid.uuid4().hex}")
            question = shared + " Second question: summarise it."
            trial: dict = {}
            for codec, (a, b) in pairs.items():
                first_token_s(a, shared + " First question: what is this about?")
                settle(a)
                seconds, trial["prompt_tokens"], cached = first_token_s(b, question)
                trial[f"ttft_remote_{codec}_ms"] = round(seconds * 1000, 1)
                trial[f"cached_tokens_{codec}"] = cached
            trial["ttft_recompute_ms"] = round(first_token_s(c, question)[0] * 1000, 1)
            trials.append(trial)
            log(f"reuse trial {i}: {trial}")
        page_bytes = {codec: ratio_of(store_counter(b, "bytes_read"),
                                      store_counter(b, "pages_read"))
                      for codec, (_, b) in pairs.items()}
    finally:
        stop(*nodes)
        for prefix in prefixes.values():
            drop_store(prefix)

    def median(key: str) -> float | None:
        return percentiles([t[key] for t in trials], points=(50,))["p50"]

    remote, recompute = median("ttft_remote_identity_ms"), median("ttft_recompute_ms")
    return {"trials": trials, "ttft_remote_p50_ms": remote, "ttft_recompute_p50_ms": recompute,
            "ttft_speedup": ratio_of(recompute, remote),
            "ttft_remote_bf16_planes_p50_ms": median("ttft_remote_bf16_planes_ms"),
            "record_bytes_per_page": page_bytes,
            "bf16_planes_bytes_saved": round(1 - page_bytes["bf16_planes"]
                                             / page_bytes["identity"], 3)}


LAYOUTS = {"colocated": "colocated (both, 2 cores)",
           "pd_http": "disaggregated, pages over HTTP (prefill core 0, decode core 1)",
           "pd_redis": "disaggregated, pages through Redis (prefill core 0, decode core 1)"}


def render(layouts: dict[str, dict], reuse: dict, vs: dict) -> str:
    rows = [[LAYOUTS[key], r["output_tok_s"], r["decode_requests"], r["long_requests"],
             f"{r['decode_ttft_ms']['p50']} / {r['decode_ttft_ms']['p99']}",
             " / ".join(str(r["decode_itl_ms"][k]) for k in ("p50", "p99", "p99.9", "max")),
             f"{r['long_ttft_ms']['p50']} / {r['long_ttft_ms']['p99']}", r["failed"]]
            for key, r in layouts.items()]
    table = markdown_table(["layout", "output tok/s", "decode reqs", "long reqs",
                            "decode TTFT p50/p99 ms", "decode ITL p50/p99/p99.9/max ms",
                            "long TTFT p50/p99 ms", "failed"], rows)
    return (f"{table}\nColocated over disaggregated, decode ITL p99 (above 1: PD lower): "
            f"{vs['itl_p99_colocated_over_pd']}; output tok/s disaggregated over colocated: "
            f"{vs['throughput_pd_over_colocated']}.\n\n"
            f"Remote prefix reuse ({reuse['trials'][0]['prompt_tokens']} tokens): TTFT "
            f"{reuse['ttft_remote_p50_ms']} ms from the store vs {reuse['ttft_recompute_p50_ms']}"
            f" ms recomputed ({reuse['ttft_speedup']}x). Through the bf16_planes codec: "
            f"{reuse['ttft_remote_bf16_planes_p50_ms']} ms, "
            f"{reuse['bf16_planes_bytes_saved']:.1%} fewer bytes a page "
            f"({reuse['record_bytes_per_page']}).\n")


def main() -> None:
    args = parse_args()
    if args.quick:
        args.duration, args.reuse_trials = 20.0, 2
    layouts: dict[str, dict] = {}
    for key, run in (("colocated", run_colocated),
                     ("pd_http", lambda a: run_disaggregated(a, "local_paged")),
                     ("pd_redis", lambda a: run_disaggregated(a, "redis"))):
        log(LAYOUTS[key])
        layouts[key] = run(args)
        log(f"{key}: {layouts[key]}")
    log("remote prefix reuse")
    reuse = run_reuse(args)
    colo = layouts["colocated"]
    # PD's figures: the better of its two page paths, named.
    best = min(("pd_http", "pd_redis"), key=lambda k: layouts[k]["decode_itl_ms"]["p99"])
    pd = layouts[best]
    vs = {"pd_layout": best,
          "itl_p99_colocated_over_pd": ratio_of(colo["decode_itl_ms"]["p99"],
                                                pd["decode_itl_ms"]["p99"]),
          "itl_p90_colocated_over_pd": ratio_of(colo["decode_itl_ms"]["p90"],
                                                pd["decode_itl_ms"]["p90"]),
          "throughput_pd_over_colocated": ratio_of(pd["output_tok_s"], colo["output_tok_s"]),
          "reuse_ttft_speedup": reuse["ttft_speedup"]}
    write_results("disagg", {
        "bench": "disagg", "model": MODEL, "machine": machine_info(),
        "workload": {k: getattr(args, k) for k in ("duration", "decoders", "decode_words",
                                                    "decode_max_tokens", "long_words",
                                                    "long_every", "long_max_tokens",
                                                    "reuse_trials")},
        **layouts, "reuse": reuse, "ratios": vs,
    }, render(layouts, reuse, vs))


if __name__ == "__main__":
    main()
