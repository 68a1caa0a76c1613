"""`edge-gateway dev` (what `make run` starts): a gateway, its edge nodes, a dev account.

The development account, its API token and an admin token (for /internal/nodes) are created
on the first run and kept in .edgefire/dev.json (git-ignored), so the README's examples work
as written on every run. The banner is printed once every node has registered and is ready,
so that a request copied from it is served rather than answered "no node"; a request that
arrives before that is held (settings.startup_hold_s) until the first node is ready.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING

from edgefire.contract.cities import load_city
from edgefire.gateway.accounts import AccountStore
from edgefire.gateway.db import Database
from edgefire.gateway.routing.directory import NodeDirectory
from edgefire.gateway.settings import GatewaySettings
from edgefire.gateway.stand_in import DEV_STAND_IN

if TYPE_CHECKING:
    import uvicorn

PREFILL_PORT_OFFSET = 100  # a disaggregated city's prefill node: its decode node's port + this
DEV_STARTUP_HOLD_S = 10.0  # a node process needs a few seconds to import torch and beat
_POLL_S = 0.1


class NodeExitedError(RuntimeError):
    """A dev node process ended before it became ready."""


def ensure_dev_account(db: Database, dev_file: Path, gateway_url: str | None = None) -> dict:
    """The {account_id, token, admin_token} in dev_file if the token still works, else new
    ones; an admin token is added to a file from before there was one. With gateway_url the
    file also says where the gateway listens (the env.AI binding's from_dev_file reads it)."""
    store = AccountStore(db)
    saved = json.loads(dev_file.read_text()) if dev_file.is_file() else {}
    fresh = dict(saved)
    if not (saved and store.authenticate(saved.get("token", "")) == saved.get("account_id")):
        account = store.create_account("development")
        _, token = store.create_token(account.id, "make run")
        fresh = {"account_id": account.id, "token": token}
    fresh["admin_token"] = fresh.get("admin_token") or secrets.token_urlsafe(24)
    if gateway_url is not None:
        fresh["gateway_url"] = gateway_url
    if fresh != saved:
        dev_file.parent.mkdir(parents=True, exist_ok=True)
        dev_file.write_text(json.dumps(fresh, indent=2) + "\n")
        dev_file.chmod(0o600)
    return fresh


def apply_dev_defaults(settings: GatewaySettings) -> None:
    """What `edge-gateway dev` turns on unless the environment says otherwise (an empty
    EDGEFIRE_STAND_IN_MODEL turns stand-ins off): a start-up hold, a stand-in model and fault
    injection. `edge-gateway start` has none of them."""
    if "startup_hold_s" not in settings.model_fields_set:
        settings.startup_hold_s = DEV_STARTUP_HOLD_S
    if "stand_in_model" not in settings.model_fields_set:
        settings.stand_in_model = DEV_STAND_IN
    if "fault_injection" not in settings.model_fields_set:
        settings.fault_injection = True


async def wait_for_fleet(directory: NodeDirectory, processes: dict[str, subprocess.Popen],
                         poll_s: float = _POLL_S) -> None:
    """Return once every node in processes (by NodeState.key) is routable; NodeExitedError if
    one exits first."""
    while not set(processes) <= {n.key for n in directory.healthy()}:
        for key, process in processes.items():
            if process.poll() is not None:
                raise NodeExitedError(f"edge node {key} exited with code {process.returncode} "
                                      "before it was ready")
        await asyncio.sleep(poll_s)


def run_dev_fleet(settings: GatewaySettings, cities: list[str] | None, dev_file: Path,
                  node_port: int | None = None, disaggregated: bool = False) -> int:
    """Serve the gateway; its nodes listen on their cities' ports, or from node_port on.
    Disaggregated, each city runs a decode node there and a prefill node PREFILL_PORT_OFFSET
    above it (README, "Prefill/decode disaggregation")."""
    import uvicorn

    from edgefire.gateway.app import create_app
    from edgefire.gateway.state import GatewayState

    settings.gateway_db.parent.mkdir(parents=True, exist_ok=True)
    base = f"http://{settings.gateway_host}:{settings.gateway_port}"
    with closing(Database(settings.gateway_db)) as db:
        dev = ensure_dev_account(db, dev_file, base)
    if not settings.node_secret:
        settings.node_secret = secrets.token_urlsafe(24)  # gateway and its nodes share it
    settings.admin_token = settings.admin_token or dev["admin_token"]
    apply_dev_defaults(settings)
    # A local Worker's env.AI (wrangler dev, Miniflare) sends no token: served as the dev
    # account, from loopback (gateway/routes_binding.py); an empty EDGEFIRE_BINDING_ACCOUNT
    # turns that off.
    if "binding_account" not in settings.model_fields_set:
        settings.binding_account = dev["account_id"]
    env = {**os.environ, "EDGEFIRE_GATEWAY_URL": base, "EDGEFIRE_NODE_SECRET": settings.node_secret}
    state = GatewayState.build(settings)
    state.dev_session = (dev["account_id"], dev["token"])  # the dashboard's sign-in
    server = uvicorn.Server(uvicorn.Config(create_app(state), host=settings.gateway_host,
                                           port=settings.gateway_port, log_level="info"))
    # Replaying answers from recordings only: no node is started (or needed).
    cities = [] if settings.replay_dir else cities or ["fra"]
    nodes = {key: subprocess.Popen([sys.executable, "-m", "edgefire.edge_nodes.cli", "start",
                                    *args], env=env)
             for key, args in node_commands(cities, node_port, disaggregated).items()}
    if cities:
        print(f"edgefire: waiting for edge node(s) {', '.join(cities)} to register…", flush=True)
    # uvicorn re-raises the SIGTERM it caught once it has shut down; under the default handler
    # that would end this process before the finally below and orphan the nodes.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return asyncio.run(serve_fleet(server, state.directory, nodes, base, dev))
    finally:
        for node in nodes.values():
            node.terminate()
        for node in nodes.values():
            node.wait(timeout=30)


def node_commands(cities: list[str], node_port: int | None, disaggregated: bool
                  ) -> dict[str, list[str]]:
    """`edge-node start` arguments of each dev node, by its directory key (NodeState.key)."""
    commands: dict[str, list[str]] = {}
    for i, city in enumerate(cities):
        port = ["--port", str(node_port + i)] if node_port else []
        if not disaggregated:
            commands[city] = ["--city", city, *port]
            continue
        decode_port = node_port + i if node_port else load_city(city).port
        commands[f"{city}/decode"] = ["--city", city, "--role", "decode", *port]
        commands[f"{city}/prefill"] = ["--city", city, "--role", "prefill", "--port",
                                       str(decode_port + PREFILL_PORT_OFFSET)]
    return commands


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)


async def serve_fleet(server: uvicorn.Server, directory: NodeDirectory,
                      nodes: dict[str, subprocess.Popen], base: str, dev: dict) -> int:
    """Serve until stopped; the banner once the nodes are ready; 1 if a node died first."""
    failed: list[str] = []

    async def announce() -> None:
        try:
            await wait_for_fleet(directory, nodes)
        except NodeExitedError as exc:
            failed.append(str(exc))
            server.should_exit = True
            return
        _banner(base, dev)

    watcher = asyncio.create_task(announce())
    try:
        await server.serve()
    finally:
        watcher.cancel()
    if failed:
        print(f"edge-gateway: {failed[0]}", file=sys.stderr)
        return 1
    return 0


def _banner(base: str, dev: dict) -> None:
    model = "@cf/huggingfacetb/smollm2-135m-instruct"
    print(f"""
edgefire gateway on {base}
  account: {dev['account_id']}
  token:   {dev['token']}        (kept in .edgefire/dev.json, with the admin_token
                                  for {base}/internal/nodes)
dashboard: {base}/
try:
  curl {base}/client/v4/accounts/{dev['account_id']}/ai/run/{model} \\
    -H "Authorization: Bearer {dev['token']}" -d '{{"prompt": "Hello!"}}'
""", flush=True)
