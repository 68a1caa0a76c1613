"""`edge-gateway dev` (what `make run` starts): a gateway, its edge nodes, a dev account.

The development account and its API token are created on the first run and kept in
.edgefire/dev.json (git-ignored), so the README's examples work as written on every run.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from contextlib import closing
from pathlib import Path

from gateway.accounts import AccountStore
from gateway.db import Database
from gateway.settings import GatewaySettings


def ensure_dev_account(db: Database, dev_file: Path) -> dict:
    """The {account_id, token} in dev_file if the token still works, else a new pair."""
    store = AccountStore(db)
    if dev_file.is_file():
        saved = json.loads(dev_file.read_text())
        if store.authenticate(saved.get("token", "")) == saved.get("account_id"):
            return saved
    account = store.create_account("development")
    _, token = store.create_token(account.id, "make run")
    saved = {"account_id": account.id, "token": token}
    dev_file.parent.mkdir(parents=True, exist_ok=True)
    dev_file.write_text(json.dumps(saved, indent=2) + "\n")
    dev_file.chmod(0o600)
    return saved


def run_dev_fleet(settings: GatewaySettings, cities: list[str] | None, dev_file: Path,
                  node_port: int | None = None) -> int:
    """Serve the gateway; its nodes listen on their cities' ports, or from node_port on."""
    import uvicorn

    from gateway.app import create_app
    from gateway.state import GatewayState

    settings.gateway_db.parent.mkdir(parents=True, exist_ok=True)
    with closing(Database(settings.gateway_db)) as db:
        dev = ensure_dev_account(db, dev_file)
    if not settings.node_secret:
        settings.node_secret = secrets.token_urlsafe(24)  # gateway and its nodes share it
    base = f"http://{settings.gateway_host}:{settings.gateway_port}"
    env = {**os.environ, "EDGEFIRE_GATEWAY_URL": base, "EDGEFIRE_NODE_SECRET": settings.node_secret}
    nodes = [subprocess.Popen([sys.executable, "-m", "edge_nodes.cli", "start", "--city", city,
                               *(["--port", str(node_port + i)] if node_port else [])], env=env)
             for i, city in enumerate(cities or ["fra"])]
    _banner(base, dev)
    try:
        uvicorn.run(create_app(GatewayState.build(settings)), host=settings.gateway_host,
                    port=settings.gateway_port, log_level="info")
    finally:
        for node in nodes:
            node.terminate()
        for node in nodes:
            node.wait(timeout=30)
    return 0


def _banner(base: str, dev: dict) -> None:
    model = "@cf/huggingfacetb/smollm2-135m-instruct"
    print(f"""
edgefire gateway on {base}
  account: {dev['account_id']}
  token:   {dev['token']}        (kept in .edgefire/dev.json)
try:
  curl {base}/client/v4/accounts/{dev['account_id']}/ai/run/{model} \\
    -H "Authorization: Bearer {dev['token']}" -d '{{"prompt": "Hello!"}}'
""", flush=True)
