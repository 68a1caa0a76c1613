"""Node settings from EDGEFIRE_* environment variables (CLI flags override them)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from edgefire.planning.node import CPU_NODE
from edgefire.runtime.engine.deterministic import Policy

MIB = 1 << 20


class NodeSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EDGEFIRE_")

    node_secret: str | None = None  # shared with the gateway; unset runs open (logged)
    catalog: Path | None = None
    # The catalog's memory needs (ModelSpec.need_bytes) are planned with these defaults.
    kv_cache_mib: int = CPU_NODE.kv_pool_bytes // MIB  # KV pool per text model
    max_num_seqs: int = CPU_NODE.reserve.max_seqs
    max_num_batched_tokens: int = CPU_NODE.reserve.step_tokens
    max_waiting_requests: int = 256  # beyond this, rejectIfBusy requests get 3040
    request_timeout_s: float = 300.0
    max_request_bytes: int = 1 << 20
    dtype: str = "auto"
    kv_backend: str = "local_paged"
    # prefill, decode or both; unset: the city's (edge_nodes/<city>.yaml). A decode node hands
    # prompts to the prefill node the gateway names (runtime/server/prefill.py).
    role: Literal["prefill", "decode", "both"] | None = None
    prefill_timeout_s: float = Field(30.0, gt=0)  # a hand-off past this is prefilled here
    # A decode node prefills prompts with fewer uncached tokens than this itself (NVIDIA
    # Dynamo's conditional disaggregation): the trip costs more than a short chunk does.
    prefill_handoff_min_tokens: int = Field(256, ge=1)
    gateway_url: str | None = None  # set, the node heartbeats to this gateway
    public_url: str | None = None  # the URL the gateway reaches this node at
    heartbeat_interval_s: float = 2.0
    # Batch-invariant requests (README, "Deterministic mode"): "1"/"all" every request,
    # "seeded" those that carry a seed, "0"/"off" none.
    deterministic: str = "off"

    @field_validator("deterministic", mode="before")
    @classmethod
    def _policy(cls, value: object) -> str:
        # Checked at start-up, not at the first model load; stored as the canonical name.
        return Policy.parse(str(value)).value
