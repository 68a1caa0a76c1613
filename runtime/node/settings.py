"""Node settings from EDGEFIRE_* environment variables (CLI flags override them)."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict


class NodeSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EDGEFIRE_")

    node_secret: str | None = None  # shared with the gateway; unset runs open (logged)
    catalog: Path | None = None
    kv_cache_mib: int = 512  # KV pool per text model
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    max_waiting_requests: int = 256  # beyond this, rejectIfBusy requests get 3040
    request_timeout_s: float = 300.0
    max_request_bytes: int = 1 << 20
    dtype: str = "auto"
    kv_backend: str = "local_paged"
    gateway_url: str | None = None  # set, the node heartbeats to this gateway
    public_url: str | None = None  # the URL the gateway reaches this node at
    heartbeat_interval_s: float = 2.0
