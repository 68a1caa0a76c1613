"""The serving bench's load driver, shared by both servers, and llama-server as the peer.

Both servers get the same requests at the same moments: one list of payloads and one list of
Poisson gaps per client count, drawn once (bench/serve.py). llama-server gets the prompt as the
token ids the edge node made of it (raw prompt, no template) and generates, with ignore_eos,
exactly as many tokens as the node did for that request, so the two do the same work.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from bench._common import log, percentiles, rate
from bench.peers import default_llama_folder

LLAMA_SERVER = "llama-server"


@dataclass(slots=True)
class RequestTrace:
    sent: float
    chunks: list[float] = field(default_factory=list)  # arrival time of each text event
    completion_tokens: int = 0
    ok: bool = False


Send = Callable[[httpx.AsyncClient, dict], Awaitable[RequestTrace]]


async def record_stream(response: httpx.Response, trace: RequestTrace) -> None:
    """Read a Workers AI event stream into trace: each text event's arrival, the usage."""
    async for line in response.aiter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        if event.get("response"):
            trace.chunks.append(time.perf_counter())
        if "usage" in event:
            trace.completion_tokens = event["usage"]["completion_tokens"]
    trace.ok = response.status_code == 200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def run_level(base: str, clients: int, payloads: Sequence[dict], gaps: Sequence[float],
                    send: Send) -> tuple[list[RequestTrace], float]:
    """Submit payload i, then wait gaps[i]; at most `clients` requests in flight."""
    limit = asyncio.Semaphore(clients)

    async def gated(payload: dict) -> RequestTrace:
        async with limit:
            return await send(client, payload)

    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        started = time.perf_counter()
        tasks = []
        for payload, gap in zip(payloads, gaps, strict=True):
            tasks.append(asyncio.create_task(gated(payload)))
            await asyncio.sleep(gap)
        traces = await asyncio.gather(*tasks)
        return traces, time.perf_counter() - started


def drive(base: str, clients: int, payloads: Sequence[dict], gaps: Sequence[float], send: Send,
          server: psutil.Process) -> tuple[list[RequestTrace], dict]:
    """Run one client count against a server; the traces and their summary."""
    cpu_before = sum(server.cpu_times()[:2])
    traces, wall = asyncio.run(run_level(base, clients, payloads, gaps, send))
    return traces, summarise(clients, traces, wall, sum(server.cpu_times()[:2]) - cpu_before)


def summarise(clients: int, traces: list[RequestTrace], wall: float, cpu_s: float) -> dict:
    ok = [t for t in traces if t.ok]
    ttft = [t.chunks[0] - t.sent for t in ok if t.chunks]
    itl = [b - a for t in ok for a, b in zip(t.chunks, t.chunks[1:], strict=False)]
    tokens = sum(t.completion_tokens for t in ok)
    return {
        "clients": clients, "requests": len(traces), "failed": len(traces) - len(ok),
        "wall_s": round(wall, 3), "req_s": rate(len(ok), wall), "output_tokens": tokens,
        "output_tok_s": rate(tokens, wall),
        "ttft_ms": percentiles(ttft, 1000), "itl_ms": percentiles(itl, 1000),
        "node_cpu_cores": round(cpu_s / wall, 2) if wall else None,  # the serving process's
    }


def wait_healthy(proc: subprocess.Popen, url: str, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{what} did not become healthy within {timeout:.0f} s")


# ---------------------------------------------------------------- llama-server


def llama_server_bin(explicit: str | None) -> Path | None:
    """llama-server in --llama-bin, else where bench/peers.py looks for llama.cpp, if built."""
    path = (Path(explicit) if explicit else default_llama_folder()) / LLAMA_SERVER
    return path if os.access(path, os.X_OK) else None


def prompt_ids(gguf: Path, prompts: Sequence[str]) -> list[list[int]]:
    """The token ids the edge node makes of each prompt (`raw`: no chat template)."""
    import gguf as gguf_py

    from edgefire.contract.text_generation import PromptInput
    from edgefire.runtime.server.prompts import encode_prompt
    from edgefire.runtime.tokenizer.gguf_tokenizer import load_gguf_tokenizer

    tokenizer = load_gguf_tokenizer(gguf_py.GGUFReader(gguf))
    return [encode_prompt(tokenizer, PromptInput(prompt=p, raw=True), 1 << 20, None)
            for p in prompts]


def llama_bodies(payloads: Sequence[dict], ids: Sequence[list[int]],
                 edgefire: Sequence[RequestTrace]) -> list[dict]:
    """/completion bodies: the same prompt, sampling and number of tokens as the node's."""
    return [{"prompt": prompt, "n_predict": trace.completion_tokens or payload["max_tokens"],
             "ignore_eos": True, "stream": True, "temperature": payload["temperature"],
             "seed": payload["seed"], "cache_prompt": True}
            for payload, prompt, trace in zip(payloads, ids, edgefire, strict=True)]


async def llama_request(client: httpx.AsyncClient, body: dict) -> RequestTrace:
    """Stream one /completion: a text event per token until the final `stop` event."""
    trace = RequestTrace(sent=time.perf_counter())
    # A fresh connection each time: llama-server may close one after a streamed answer, and a
    # request sent on it at that moment fails (RemoteProtocolError) instead of being served.
    async with client.stream("POST", "/completion", json=body,
                             headers={"Connection": "close"}) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event.get("stop"):
                trace.completion_tokens = event.get("tokens_predicted", 0)
            elif event.get("content"):
                trace.chunks.append(time.perf_counter())
        trace.ok = response.status_code == 200
    return trace


def start_llama_server(server: Path, gguf: Path, slots: int, ctx_per_slot: int, threads: int,
                       log_path: Path) -> tuple[subprocess.Popen, str]:
    """llama-server with `slots` parallel slots (-np), each with room for ctx_per_slot tokens:
    -c is the whole KV cache, split evenly between the slots."""
    port = free_port()
    cmd = [str(server), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
           "-np", str(slots), "-c", str(slots * ctx_per_slot), "-t", str(threads),
           "-tb", str(threads), "--no-webui"]
    log("$ " + " ".join(cmd))
    with log_path.open("ab") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    wait_healthy(proc, base + "/health", "llama-server")
    return proc, base


def run_llama_server(server: Path, gguf: Path, variant: str, threads: int,
                     levels: Sequence[tuple[int, list[dict], list[float]]],
                     edgefire: Sequence[list[RequestTrace]], log_path: Path) -> dict:
    """Every client count against a fresh llama-server with that many slots."""
    ids = prompt_ids(gguf, [p["prompt"] for _, payloads, _ in levels for p in payloads])
    bodies_per_level, at = [], 0
    for (_, payloads, _), traces in zip(levels, edgefire, strict=True):
        bodies_per_level.append(llama_bodies(payloads, ids[at:at + len(payloads)], traces))
        at += len(payloads)
    longest = max(len(b["prompt"]) + b["n_predict"] for bs in bodies_per_level for b in bs)
    ctx_per_slot = -(-(longest + 64) // 256) * 256
    results = []
    for (clients, _, gaps), bodies in zip(levels, bodies_per_level, strict=True):
        proc, base = start_llama_server(server, gguf, clients, ctx_per_slot, threads, log_path)
        try:
            httpx.post(base + "/completion", json={"prompt": "warm up", "n_predict": 4},
                       timeout=300)
            _, summary = drive(base, clients, bodies, gaps, llama_request,
                               psutil.Process(proc.pid))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        log(f"llama-server C={clients}: {summary}")
        results.append(summary)
    return {"available": True, "server": str(server), "variant": variant, "gguf": str(gguf),
            "threads": threads, "ctx_per_slot": ctx_per_slot, "log": str(log_path),
            "endpoint": "/completion (token-id prompt, stream, ignore_eos, n_predict = the "
                        "node's completion tokens for the same request)",
            "levels": results}
