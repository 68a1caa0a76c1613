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
    node_secret: str | None = None  # sent to nodes; nodes' heartbeats must carry it
    heartbeat_timeout_s: float = 6.0
    max_request_bytes: int = 1 << 20
    catalog: Path | None = None


def load_gateway_yaml(path: Path | None) -> dict:
    """`providers: {name: {type, base_url, api_key_env}}` and `ip_map: {ip_or_prefix: city}`."""
    if path is None:
        return {"providers": {}, "ip_map": {}}
    data = yaml.safe_load(Path(path).read_text()) or {}
    return {"providers": data.get("providers") or {}, "ip_map": data.get("ip_map") or {}}
