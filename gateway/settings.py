"""Gateway settings: EDGEFIRE_* environment variables, then gateway.yaml for providers."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic_settings import BaseSettings, SettingsConfigDict


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EDGEFIRE_")

    gateway_host: str = "127.0.0.1"
    gateway_port: int = 8787
    gateway_db: Path = Path(".edgefire") / "gateway.db"
    gateway_config: Path | None = None  # gateway.yaml: providers, IP → city map
    redis_url: str | None = None  # shared cache and rate limits when set
    node_secret: str | None = None  # the fleet's: sent to nodes, their heartbeats carry it
    admin_token: str | None = None  # Bearer token for /internal/nodes (unset: refused)
    heartbeat_timeout_s: float = 6.0
    max_nodes: int = 256  # live cities; a new one past this is refused
    max_heartbeat_bytes: int = 64 << 10
    max_heartbeat_models: int = 128  # loaded_models entries in one heartbeat
    startup_hold_s: float = 0.0  # until a first node is ready, hold requests this long
    max_request_bytes: int = 1 << 20
    catalog: Path | None = None


def load_gateway_yaml(path: Path | None) -> dict:
    """`providers: {name: {type, base_url, api_key_env, allowed_paths}}`, `ip_map:
    {ip_or_prefix: city}` and `nodes: {city: {secret_env}}` (a city's own node credential)."""
    if path is None:
        return {"providers": {}, "ip_map": {}, "nodes": {}}
    data = yaml.safe_load(Path(path).read_text()) or {}
    return {name: data.get(name) or {} for name in ("providers", "ip_map", "nodes")}
