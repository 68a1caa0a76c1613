"""The heartbeat: what a node tells the gateway every few seconds, as one typed report.

The node builds a NodeReport and posts `to_json()` to HEARTBEAT_PATH; the gateway reads it back
with `NodeReport.from_json`, which checks the HEARTBEAT schema first (5006 naming the field).
What only the gateway's policy decides (an origin URL, how many models it accepts) stays with
the gateway (edgefire.gateway.routing.report).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from edgefire.contract.schemas import HEARTBEAT
from edgefire.contract.validation import Checker

HEARTBEAT_PATH = "/internal/nodes/heartbeat"
_HEARTBEAT = Checker(HEARTBEAT)


@dataclass(slots=True)
class NodeReport:
    city: str
    url: str  # where the gateway reaches the node: an http(s) origin
    lat: float
    lon: float
    memory_budget_bytes: int
    accelerator_bytes: int
    # model id -> what the node says of it (memory_bytes, weight_precision, …)
    loaded_models: dict[str, dict[str, Any]] = field(default_factory=dict)
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0  # the fullest loaded model's share of its KV blocks in use
    name: str = ""
    role: str = "both"  # prefill, decode or both
    status: str = "ok"  # "ok", "degraded" (a model failed lately) or "starting"
    # What the city declares to the capacity planner, {"kind": "nvidia-h100", "count": 8};
    # None: a node that declares nothing is placed by its memory budget alone.
    accelerators: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, payload: object) -> NodeReport:
        body = _HEARTBEAT.check(payload)
        return cls(
            city=body["city"], url=body["url"], lat=float(body["lat"]), lon=float(body["lon"]),
            # JSON Schema counts 2.0 as an integer; the gateway keeps ints.
            memory_budget_bytes=int(body["memory_budget_bytes"]),
            accelerator_bytes=int(body["accelerator_bytes"]),
            loaded_models=body.get("loaded_models", {}),
            running=int(body.get("running", 0)), waiting=int(body.get("waiting", 0)),
            kv_usage=float(body.get("kv_usage", 0.0)), name=body.get("name") or "",
            role=body.get("role") or "both", status=body.get("status") or "ok",
            accelerators=body.get("accelerators"))
