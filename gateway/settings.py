"""Gateway settings: EDGEFIRE_* environment variables, then gateway.yaml for providers."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EDGEFIRE_")

    gateway_host: str = "127.0.0.1"
    gateway_port: int = 8787
    gateway_db: Path = Path(".edgefire") / "gateway.db"
    gateway_config: Path | None = None  # gateway.yaml: providers, IP → city map
    redis_url: str | None = None  # shared cache and rate limits when set
    # Bounds Redis's connect and each reply, so a dead or silent Redis costs little per request.
    redis_timeout_s: float = Field(0.5, gt=0)
    # While Redis fails, "open" lets requests through unlimited; "closed" answers 503 (2003).
    rate_limit_on_redis_error: Literal["open", "closed"] = "open"
    # The in-memory response cache's byte budget, shared fairly between accounts; answers over
    # the entry cap are never cached (in Redis either).
    cache_max_bytes: int = Field(256 << 20, ge=1)
    cache_max_entry_bytes: int = Field(8 << 20, ge=1)
    # Logs kept per gateway (the oldest go first) and, when set, their maximum age.
    log_max_per_gateway: int = Field(100_000, ge=1)
    log_retention_days: float | None = Field(None, gt=0)
    node_secret: str | None = None  # the fleet's: sent to nodes, their heartbeats carry it
    admin_token: str | None = None  # Bearer token for /internal/nodes (unset: refused)
    heartbeat_timeout_s: float = 6.0
    max_nodes: int = 256  # live cities; a new one past this is refused
    max_heartbeat_bytes: int = 64 << 10
    max_heartbeat_models: int = 128  # loaded_models entries in one heartbeat
    startup_hold_s: float = 0.0  # until a first node is ready, hold requests this long
    max_request_bytes: int = 1 << 20
    # Async batch: Workers AI takes batches under 10 MB; answers are kept this long to poll.
    max_batch_bytes: int = 10 << 20
    batch_retention_s: float = Field(86400.0, gt=0)
    catalog: Path | None = None
    # A runnable text-generation model that answers for one no node can host (planning-only,
    # or larger than every live node's budget); unset or empty: such requests are refused.
    # `edge-gateway dev` defaults it to SmolLM2 (gateway/stand_in.py).
    stand_in_model: str | None = None
    # x-edgefire-fault and gateway.yaml `faults:` (gateway/faults.py); on in `edge-gateway dev`.
    fault_injection: bool = False
    # A Worker's env.AI calls (gateway/routes_binding.py) carry no account or token. When set,
    # such a call from loopback is served as this account; `edge-gateway dev` sets it to the
    # dev account, `edge-gateway start` leaves it unset (a token is then required).
    binding_account: str | None = None
    # Record/replay (edgefire.gateway.recording): record every inference answer into this
    # folder, or answer inference routes from its recordings only (no node needed).
    record_dir: Path | None = None
    replay_dir: Path | None = None
    # 1 replays streams with their recorded timing, 2 twice as fast, 0 without waiting.
    replay_speed: float = Field(1.0, ge=0)
    # A request replayed more times than it was recorded: "error" answers 5090, "cycle"
    # starts again from its first recorded answer.
    replay_exhausted: Literal["error", "cycle"] = "error"


def load_gateway_yaml(path: Path | None) -> dict:
    """`providers: {name: {type, base_url, api_key_env, allowed_paths}}`, `ip_map:
    {ip_or_prefix: city}`, `nodes: {city: {secret_env}}` (a city's own node credential) and
    `faults: [{model, fault, every | probability, seed}]` (edgefire.gateway.faults)."""
    if path is None:
        return {"providers": {}, "ip_map": {}, "nodes": {}, "faults": []}
    data = yaml.safe_load(Path(path).read_text()) or {}
    return {**{name: data.get(name) or {} for name in ("providers", "ip_map", "nodes")},
            "faults": data.get("faults") or []}
