"""The fleet a soak runs against: `make run`'s (`edge-gateway dev`) started privately, or one
already running; and what the soak reads from its node (KV blocks in use, load, RSS)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from bench._common import SENTENCES, log
from bench.soak_mix import MINILM, SMOL
from edgefire.contract.cities import load_city
from edgefire.planning import CPU_NODE

ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = ("127.0.0.1", "localhost")
# Settings of the user's own fleet that must not leak into the private one.
_PRIVATE_ENV = ("EDGEFIRE_GATEWAY_URL", "EDGEFIRE_PUBLIC_URL", "EDGEFIRE_GATEWAY_DB",
                "EDGEFIRE_GATEWAY_HOST", "EDGEFIRE_GATEWAY_PORT", "EDGEFIRE_GATEWAY_CONFIG")


@dataclass(slots=True)
class Fleet:
    gateway_url: str
    node_url: str
    account: str
    token: str
    node_pid: int | None
    gateway_pid: int | None
    started: bool  # by us: we stop it
    log_path: Path | None = None
    processes: list[psutil.Process] = field(default_factory=list)


@dataclass(slots=True)
class NodeLoad:
    kv_blocks_in_use: int
    running: int
    waiting: int


def check_loopback(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in LOOPBACK:
        raise SystemExit(f"soak: {url} is not an http://127.0.0.1 URL; the soak stays local")
    return url.rstrip("/")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def private_fleet(city: str, startup_timeout_s: float = 180.0) -> Iterator[Fleet]:
    """`edge-gateway dev` in a temporary directory, on free ports; stopped (as Ctrl-C stops
    `make run`) when the block ends, and any node left behind is killed."""
    with tempfile.TemporaryDirectory(prefix="edgefire-soak-") as tmp:
        workdir = Path(tmp)
        gateway_port, node_port = free_port(), free_port()
        env = {k: v for k, v in os.environ.items() if k not in _PRIVATE_ENV}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "edgefire.gateway.cli", "dev", "--city", city,
               "--port", str(gateway_port), "--node-port", str(node_port)]
        log_path = workdir / "fleet.log"
        with log_path.open("wb") as out:
            proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        fleet = None
        try:
            fleet = _wait_for_fleet(proc, workdir, gateway_port, node_port, city,
                                    startup_timeout_s, log_path)
            yield fleet
        finally:
            _stop(proc, fleet.processes if fleet else [])


def _wait_for_fleet(proc: subprocess.Popen, workdir: Path, gateway_port: int, node_port: int,
                    city: str, timeout_s: float, log_path: Path) -> Fleet:
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the fleet exited ({proc.returncode}):\n{_tail(log_path)}")
        with contextlib.suppress(httpx.HTTPError, ValueError):
            health = httpx.get(f"{gateway_url}/health", timeout=2, trust_env=False).json()
            if city in health.get("healthy_nodes", []):
                break
        time.sleep(0.25)
    else:
        raise RuntimeError(f"node {city} did not register in {timeout_s:.0f}s:\n"
                           f"{_tail(log_path)}")
    dev = json.loads((workdir / ".edgefire" / "dev.json").read_text())
    children = psutil.Process(proc.pid).children(recursive=True)
    nodes = [p for p in children if "edgefire.edge_nodes.cli" in " ".join(p.cmdline())]
    return Fleet(gateway_url, f"http://127.0.0.1:{node_port}", dev["account_id"], dev["token"],
                 nodes[0].pid if nodes else None, proc.pid, True, log_path,
                 [psutil.Process(proc.pid), *children])


def _stop(proc: subprocess.Popen, processes: list[psutil.Process]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # what Ctrl-C on `make run` sends
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for p in processes:  # a node the gateway did not stop
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.is_running():
                log(f"fleet process {p.pid} outlived the gateway; killing it")
                p.kill()


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def attached_fleet(gateway_url: str, dev_file: Path, node_url: str | None, city: str) -> Fleet:
    """A fleet already running (`make run`): its dev account, and its node from the gateway's
    directory (with the dev admin token, if any) or the city's port."""
    gateway_url = check_loopback(gateway_url)
    dev = json.loads(dev_file.read_text())
    if node_url is None:
        node_url = _node_from_directory(gateway_url, dev, city) or \
            f"http://127.0.0.1:{load_city(city).port}"
    node_url = check_loopback(node_url)
    return Fleet(gateway_url, node_url, dev["account_id"], dev["token"],
                 _listener_pid(node_url), _listener_pid(gateway_url), False)


def _node_from_directory(gateway_url: str, dev: dict, city: str) -> str | None:
    headers = {"authorization": f"Bearer {dev['admin_token']}"} if dev.get("admin_token") else {}
    try:
        response = httpx.get(f"{gateway_url}/internal/nodes", headers=headers, timeout=5,
                             trust_env=False)
        nodes = response.json().get("nodes", []) if response.status_code == 200 else []
    except (httpx.HTTPError, ValueError):
        return None
    return next((n["url"] for n in nodes if n.get("city") == city), None)


def _listener_pid(url: str) -> int | None:
    port = urlsplit(url).port
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            for conn in proc.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port:
                    return proc.pid
    return None


def warm_up(fleet: Fleet, timeout_s: float = 300.0) -> None:
    """Both models loaded and answering (a 429 "no data centers" while the node registers is
    retried) before anything is measured, then one prompt that fills a whole step: an engine
    keeps its step buffers at the largest step it has run (tens of MiB more after a step of
    the node's 1,024-token budget than after short prompts), which the mix's short prompts reach
    only now and then, so a baseline taken before such a step counts that as growth."""
    headers = {"authorization": f"Bearer {fleet.token}"}
    base = f"{fleet.gateway_url}/client/v4/accounts/{fleet.account}/ai/run/"
    words = " ".join(SENTENCES).split()
    # at least a token a word: a prompt of step_tokens words fills the step's token budget
    full_step = " ".join(words[i % len(words)] for i in range(CPU_NODE.reserve.step_tokens))
    for model, body in ((SMOL, {"prompt": "Hello", "max_tokens": 2}), (MINILM, {"text": "hi"}),
                        (SMOL, {"prompt": full_step, "max_tokens": 2})):
        deadline = time.monotonic() + timeout_s
        while True:
            response = httpx.post(base + model, json=body, headers=headers, timeout=timeout_s,
                                  trust_env=False)
            if response.status_code == 200:
                break
            if response.status_code != 429 or time.monotonic() > deadline:
                raise RuntimeError(f"warm-up {model}: {response.status_code} {response.text}")
            time.sleep(0.5)


def node_load(node_url: str) -> NodeLoad:
    text = httpx.get(f"{node_url}/metrics", timeout=10, trust_env=False).text
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0) + sample.value
    return NodeLoad(int(values.get("edgefire_kv_blocks_in_use", 0)),
                    int(values.get("edgefire_requests_running", 0)),
                    int(values.get("edgefire_requests_waiting", 0)))


def rss_mib(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        return round(psutil.Process(pid).memory_info().rss / (1 << 20), 1)
    except psutil.Error:
        return None
