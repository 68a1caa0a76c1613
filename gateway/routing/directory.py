"""The gateway's view of the edge nodes, fed by their heartbeats, and candidate ranking."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass

from gateway.routing.geo import great_circle_km, latency_ms
from runtime.server.schemas import HEARTBEAT
from runtime.server.validation import Checker

# A cold load takes seconds, but whether a node is worth it also depends on the user's
# latency on every later request: this many ms lets a loaded neighbour (tens of ms
# further) win, while a loaded node on another continent (100+ ms further) does not.
COLD_LOAD_PENALTY_MS = 50.0
MAX_PINNED_SESSIONS = 100_000  # oldest pins are forgotten first
_HEARTBEAT = Checker(HEARTBEAT)


@dataclass(slots=True)
class NodeState:
    city: str
    url: str
    lat: float
    lon: float
    memory_budget_bytes: int
    accelerator_bytes: int
    loaded_models: dict[str, dict]
    running: int
    waiting: int
    kv_usage: float
    last_heartbeat: float
    failed_until: float = 0
    name: str = ""
    role: str = "both"

    def can_hold(self, model_id: str, need_bytes: int) -> bool:
        return model_id in self.loaded_models or need_bytes <= self.memory_budget_bytes


class NodeDirectory:
    def __init__(self, heartbeat_timeout_s: float = 6.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._clock = clock
        self._nodes: dict[str, NodeState] = {}
        self._sessions: OrderedDict[str, str] = OrderedDict()

    def heartbeat(self, payload: dict) -> NodeState:
        """Register a node or refresh it from what it reports; InvalidInputError (naming the
        field) unless it matches the HEARTBEAT schema."""
        fields = _validate(payload)
        now = self._clock()
        node = self._nodes.get(fields["city"])
        if node is None:
            node = NodeState(**fields, last_heartbeat=now)
            self._nodes[node.city] = node
        else:
            for key, value in fields.items():
                setattr(node, key, value)
            node.last_heartbeat = now
        # A heartbeat during the cooldown does not revive a node that just refused a
        # connection: its heartbeat may have been sent before it failed.
        if node.failed_until and now >= node.failed_until:
            node.failed_until = 0
        return node

    def mark_failed(self, city: str, cooldown_s: float = 5.0) -> None:
        """Stop routing to city until it heartbeats again after cooldown_s."""
        node = self._nodes.get(city)
        if node is not None:
            node.failed_until = self._clock() + cooldown_s

    def nodes(self) -> list[NodeState]:
        return sorted(self._nodes.values(), key=lambda n: n.city)

    def healthy(self) -> list[NodeState]:
        now = self._clock()
        return [n for n in self.nodes() if self._is_healthy(n, now)]

    def pin(self, session_id: str, city: str) -> None:
        """Keep session_id on city, which now holds its prefix cache."""
        self._sessions[session_id] = city
        self._sessions.move_to_end(session_id)
        while len(self._sessions) > MAX_PINNED_SESSIONS:
            self._sessions.popitem(last=False)

    def candidates(self, model_id: str, need_bytes: int, location: tuple[float, float] | None,
                   session_id: str | None = None, max_waiting: int = 8) -> list[NodeState]:
        """Healthy nodes that can hold model_id, best first.

        Order: the session's pinned node (unless its queue is deep), then nodes with a short
        queue by estimated cost (latency to the client, plus COLD_LOAD_PENALTY_MS where the
        model is not loaded), then nodes with a deep queue (waiting >= max_waiting) in the
        same order, so load spills over to the next best node. Ties go to the less busy node,
        then the city code.
        """
        eligible = [n for n in self.healthy() if n.can_hold(model_id, need_bytes)]
        pinned = self._sessions.get(session_id) if session_id else None

        def key(node: NodeState) -> tuple:
            # deep leads the key so that a pinned node with a deep queue spills over too.
            deep = node.waiting >= max_waiting
            cost = 0.0 if location is None else latency_ms(
                great_circle_km(location[0], location[1], node.lat, node.lon))
            if model_id not in node.loaded_models:
                cost += COLD_LOAD_PENALTY_MS
            return (deep, node.city != pinned, cost, node.running + node.waiting, node.city)

        return sorted(eligible, key=key)

    def to_json(self) -> dict:
        """The directory as JSON-ready data, for the gateway's /nodes debug view."""
        now = self._clock()
        return {
            "heartbeat_timeout_s": self.heartbeat_timeout_s,
            "nodes": [{**asdict(n), "healthy": self._is_healthy(n, now),
                       "heartbeat_age_s": round(now - n.last_heartbeat, 3)}
                      for n in self.nodes()],
        }

    def _is_healthy(self, node: NodeState, now: float) -> bool:
        return not node.failed_until and now - node.last_heartbeat <= self.heartbeat_timeout_s


def _validate(payload: object) -> dict:
    body = _HEARTBEAT.check(payload)
    return {
        "city": body["city"], "url": body["url"],
        "lat": float(body["lat"]), "lon": float(body["lon"]),
        # JSON Schema counts 2.0 as an integer; the directory keeps ints.
        "memory_budget_bytes": int(body["memory_budget_bytes"]),
        "accelerator_bytes": int(body["accelerator_bytes"]),
        "loaded_models": body.get("loaded_models", {}),
        "running": int(body.get("running", 0)), "waiting": int(body.get("waiting", 0)),
        "kv_usage": float(body.get("kv_usage", 0.0)),
        "name": body.get("name") or "", "role": body.get("role") or "both",
    }
