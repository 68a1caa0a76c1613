"""HTTP serving benchmark of one edge node, in the style of vLLM's benchmark_serving.

Starts `edge-node start --city fra` on a free port, then for each client count C sends
requests whose arrivals follow a Poisson process at --request-rate, with at most C in flight,
prompt and output lengths drawn from fixed ranges with a fixed seed. Streams every response
(Workers AI SSE) to time TTFT and inter-token latency, and samples the node's CPU use.
Then drives llama-server (llama.cpp, -np C parallel slots) on each --llama-variants GGUF in
turn with the same requests at the same moments (bench/serve_peer.py), and reports
edgefire/llama-server ratios per client count against the best variant there. The machine's
roofline (bench/roofline.py) goes in the result too.

Run from the repository root: .venv/bin/python -m bench.serve [--clients 1,4,16] [--quick]
"""

from __future__ import annotations

import argparse
import math
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from bench._common import SENTENCES, log, machine_info, markdown_table, ratio, write_results
from bench.gguf_variants import FORMATS, SHIPPED, ensure_variants
from bench.roofline import measure_roofline
from bench.serve_peer import (
    RequestTrace,
    drive,
    free_port,
    llama_server_bin,
    record_stream,
    run_llama_server,
    wait_healthy,
)

MODEL = "@cf/huggingfacetb/smollm2-135m-instruct"
ROUTE = "/client/v4/accounts/bench/ai/run/" + MODEL


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", default="1,4,16", help="comma list of max in-flight requests")
    p.add_argument("--requests-per-client", type=int, default=4)
    p.add_argument("--request-rate", type=float, default=8.0,
                   help="Poisson arrivals per second; inf sends each as soon as a client is free "
                        "(throughput at saturation: at 8/s a fast server is bound by arrivals)")
    p.add_argument("--prompt-words", default="24,160", help="uniform range of prompt words")
    p.add_argument("--max-tokens", default="32,128", help="uniform range of max_tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="clients 1,4; 2 requests each")
    p.add_argument("--skip-llama", action="store_true", help="no llama-server peer")
    p.add_argument("--llama-bin", default=None, help="folder with llama-server")
    p.add_argument("--llama-variants", default="q8_0,bf16",
                   help="GGUFs llama-server serves, each in turn (default q8_0,bf16; of "
                        f"{', '.join([SHIPPED, *FORMATS])}: bench/gguf_variants.py); every "
                        "ratio is against the best of them at that client count")
    p.add_argument("--llama-threads", type=int, default=2, help="llama-server -t")
    p.add_argument("--name", default="serve", help="result file bench/results/<name>.json")
    args = p.parse_args()
    args.llama_variants = [v.strip() for v in args.llama_variants.split(",") if v.strip()]
    unknown = set(args.llama_variants) - {SHIPPED, *FORMATS}
    if unknown:
        p.error(f"unknown llama variants: {sorted(unknown)}")
    return args


def start_node(port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "edgefire.edge_nodes.cli", "start", "--city", "fra",
           "--port", str(port)]
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_healthy(proc, f"http://127.0.0.1:{port}/health", "the edge node")
    return proc


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
        await record_stream(response, trace)
    return trace


def make_levels(args: argparse.Namespace) -> list[tuple[int, list[dict], list[float]]]:
    """Per client count: the payloads and the Poisson gaps after each, drawn once so both
    servers see the same arrivals (in the order the rng was always drawn in)."""
    levels = [1, 4] if args.quick else [int(c) for c in args.clients.split(",")]
    per_client = 2 if args.quick else args.requests_per_client
    rng = random.Random(args.seed)
    out = []
    for clients in levels:
        workload = make_workload(max(8, clients * per_client), args, rng)
        out.append((clients, workload, [rng.expovariate(args.request_rate) for _ in workload]))
    return out


DRAFT_METRICS = {"proposed": "edgefire_spec_decode_draft_tokens_total",
                 "accepted": "edgefire_spec_decode_accepted_tokens_total"}


def draft_counts(base: str) -> dict[str, float]:
    """The node's speculative draft counters (/metrics), summed over its models."""
    text = httpx.get(base + "/metrics", timeout=30).text
    counts = dict.fromkeys(DRAFT_METRICS, 0.0)
    for family in text_string_to_metric_families(text):
        for key, name in DRAFT_METRICS.items():
            counts[key] += sum(s.value for s in family.samples if s.name == name)
    return counts


def run_edgefire(levels: list[tuple[int, list[dict], list[float]]]
                 ) -> tuple[list[dict], list[list[RequestTrace]]]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log(f"starting edge node fra on :{port}")
    node = start_node(port)
    summaries, traces = [], []
    try:
        node_ps = psutil.Process(node.pid)
        httpx.post(base + ROUTE, json={"prompt": "warm up", "max_tokens": 4}, timeout=300)
        for clients, workload, gaps in levels:
            before = draft_counts(base)
            level_traces, summary = drive(base, clients, workload, gaps, one_request, node_ps)
            after = draft_counts(base)
            # speculative drafts verified at this level, and how many stood
            summary["drafts"] = {k: int(after[k] - before[k]) for k in DRAFT_METRICS}
            log(f"edgefire C={clients}: {summary}")
            summaries.append(summary)
            traces.append(level_traces)
    finally:
        node.terminate()
        node.wait(timeout=30)
    return summaries, traces


def llama_peer(args: argparse.Namespace, variant: str, levels: list, traces: list) -> dict:
    if args.skip_llama:
        return {"available": False, "note": "skipped (--skip-llama)"}
    server = llama_server_bin(args.llama_bin)
    if server is None:
        return {"available": False,
                "note": "llama-server not found; run bash ../shared/peers/build-llama-cpp"}
    from edgefire.contract.catalog import Catalog
    from edgefire.runtime.weights import resolve_source

    shipped = Path(resolve_source(Catalog.load().get_runnable(MODEL).weights))
    log_path = Path(tempfile.gettempdir()) / f"llama-server-{int(time.time())}.log"
    try:
        gguf = ensure_variants(shipped, [variant])[variant]
        return run_llama_server(server, gguf, variant, args.llama_threads, levels, traces,
                                log_path)
    except (RuntimeError, OSError, ValueError, httpx.HTTPError) as exc:
        log(f"llama-server failed: {exc!r} (log: {log_path})")
        return {"available": False, "note": f"llama-server failed: {exc!r}", "log": str(log_path)}


def best_peer(peers: dict[str, dict]) -> dict:
    """llama-server at its best per client count: of the variants that ran, the level with the
    most output tok/s, naming its variant."""
    ran = [peer for peer in peers.values() if peer.get("available", True) and peer.get("levels")]
    if not ran:
        return {"available": False, "note": "no llama-server variant ran",
                "variants": sorted(peers)}
    levels = []
    for at_level in zip(*(peer["levels"] for peer in ran), strict=True):
        pick = max(range(len(ran)), key=lambda i: at_level[i]["output_tok_s"])
        levels.append({**at_level[pick], "variant": ran[pick]["variant"]})
    return {"available": True, "variant": "best per client count", "levels": levels}


def versus(edgefire: list[dict], peer: dict) -> dict:
    """edgefire / llama-server per client count: output tok/s (above 1: edgefire serves more),
    TTFT and ITL p99 (below 1: edgefire answers sooner)."""
    out = {}
    for ours, theirs in zip(edgefire, peer.get("levels", []), strict=False):
        out[str(ours["clients"])] = {
            "output_tok_s": ratio(ours["output_tok_s"], theirs["output_tok_s"]),
            "itl_p99_ms": ratio(ours["itl_ms"]["p99"], theirs["itl_ms"]["p99"]),
            "ttft_p99_ms": ratio(ours["ttft_ms"]["p99"], theirs["ttft_ms"]["p99"]),
            "output_tokens": [ours["output_tokens"], theirs["output_tokens"]],
            "llama_variant": theirs.get("variant", peer.get("variant"))}
    return out


def render(levels: list[dict], peers: dict[str, dict], vs: dict, roof: dict) -> str:
    named = [("edgefire", r) for r in levels]
    named += [(f"llama-server ({peer['variant']})", r) for peer in peers.values()
              for r in peer.get("levels", [])]
    named.sort(key=lambda pair: pair[1]["clients"])
    rows = [[r["clients"], name, r["requests"], r["req_s"], r["output_tok_s"],
             f"{r['ttft_ms']['p50']} / {r['ttft_ms']['p99']}",
             f"{r['itl_ms']['p50']} / {r['itl_ms']['p99']}", r["node_cpu_cores"],
             f"{r['drafts']['accepted']} / {r['drafts']['proposed']}" if "drafts" in r else "-"]
            for name, r in named]
    table = markdown_table(["clients", "server", "requests", "req/s", "output tok/s",
                            "TTFT p50/p99 ms", "ITL p50/p99 ms", "server CPU (cores)",
                            "drafts accepted / proposed"], rows)
    ratios = markdown_table(
        ["clients", "output tok/s (higher: edgefire ahead)", "ITL p99 (lower: edgefire ahead)",
         "TTFT p99 (lower: edgefire ahead)", "vs llama-server"],
        [[c, v["output_tok_s"], v["itl_p99_ms"], v["ttft_p99_ms"], v["llama_variant"]]
         for c, v in vs.items()])
    return (f"Roofline ({roof.get('threads')} threads): {roof.get('read_gb_s')} GB/s read, "
            f"{roof.get('gemm_tflop_s')} {roof.get('gemm_dtype')} GEMM TFLOP/s.\n\n{table}"
            + (f"\nedgefire / llama-server:\n\n{ratios}" if vs else ""))


def main() -> None:
    args = parse_args()
    levels = make_levels(args)
    results, traces = run_edgefire(levels)
    peers = {variant: llama_peer(args, variant, levels, traces)
             for variant in args.llama_variants}
    peer = best_peer(peers)
    vs = versus(results, peer)
    roof = measure_roofline()
    write_results(args.name, {
        "bench": "serve", "model": MODEL, "machine": machine_info(), "roofline": roof,
        "workload": {"request_rate": (args.request_rate if math.isfinite(args.request_rate)
                                      else "inf"), "prompt_words": args.prompt_words,
                     "max_tokens": args.max_tokens, "seed": args.seed, "temperature": 0.7},
        "levels": results, "llama_servers": peers, "llama_server": peer,
        "vs_llama_server": vs,
    }, render(results, peers, vs, roof))


if __name__ == "__main__":
    main()
