"""The gateway's view of the edge nodes, fed by their heartbeats, and candidate ranking."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass

from edgefire.contract.errors import ForbiddenError, InvalidInputError
from edgefire.gateway.node_auth import OPEN
from edgefire.gateway.routing.geo import great_circle_km, latency_ms
from edgefire.gateway.routing.report import validate

# A cold load takes seconds, but whether a node is worth it also depends on the user's
# latency on every later request: this many ms lets a loaded neighbour (tens of ms
# further) win, while a loaded node on another continent (100+ ms further) does not.
COLD_LOAD_PENALTY_MS = 50.0
MAX_PINNED_SESSIONS = 100_000  # oldest pins are forgotten first


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
    status: str = "ok"  # "ok", "degraded" (ranked last) or "starting" (never routed to)
    accelerators: dict | None = None  # declared {"kind", "count"}; None: placed by budget
    credential: str = OPEN  # the id of the node credential this city is bound to

    @property
    def key(self) -> str:
        """The directory's key: the city, or city/role for one of its prefill or decode
        nodes (a disaggregated city runs one of each)."""
        return self.city if self.role == "both" else f"{self.city}/{self.role}"

    def can_hold(self, model_id: str, need_bytes: int) -> bool:
        return model_id in self.loaded_models or need_bytes <= self.memory_budget_bytes


class NodeDirectory:
    def __init__(self, heartbeat_timeout_s: float = 6.0,
                 clock: Callable[[], float] = time.monotonic, *, max_nodes: int = 256,
                 max_models: int = 128, startup_hold_s: float = 0.0) -> None:
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.max_nodes = max_nodes
        self.max_models = max_models
        self.startup_hold_s = startup_hold_s
        self._clock = clock
        self._nodes: dict[str, NodeState] = {}
        # Keyed by (account, session id): one account's id never steers another's requests.
        self._sessions: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._ready = asyncio.Event()  # set once a node is routable; ends the start-up hold

    def heartbeat(self, payload: object, credential: str = OPEN) -> NodeState:
        """Register a node or refresh it from what it reports, sent with `credential`.

        InvalidInputError if malformed or a new city past max_nodes; ForbiddenError when a
        live city is bound to another credential (so its URL cannot be taken over).
        """
        fields = asdict(validate(payload, self.max_models))
        now = self._clock()
        reported = NodeState(**fields, last_heartbeat=now, credential=credential)
        node = self._nodes.get(reported.key)
        if node is not None and node.credential != credential and self._is_live(node, now):
            raise ForbiddenError(f"city {node.city!r} is bound to another node credential")
        if node is None:
            self._make_room(now)
            node = reported
            self._nodes[node.key] = node
        else:
            for key, value in fields.items():
                setattr(node, key, value)
            node.last_heartbeat = now
            node.credential = credential
        # A heartbeat during the cooldown does not revive a node that just refused a
        # connection: its heartbeat may have been sent before it failed.
        if node.failed_until and now >= node.failed_until:
            node.failed_until = 0
        if self._is_healthy(node, now):
            self._ready.set()
        return node

    def _make_room(self, now: float) -> None:
        """Forget silent nodes to admit a new city; refuse it when all max_nodes are live."""
        if len(self._nodes) < self.max_nodes:
            return
        for key in [k for k, n in self._nodes.items() if not self._is_live(n, now)]:
            del self._nodes[key]
        if len(self._nodes) >= self.max_nodes:
            raise InvalidInputError(f"the gateway already tracks {self.max_nodes} live nodes "
                                    "(EDGEFIRE_MAX_NODES); a new city is refused", field="city")

    @property
    def starting(self) -> bool:
        """True until the first node is routable, while a start-up hold is configured."""
        return self.startup_hold_s > 0 and not self._ready.is_set()

    async def wait_until_ready(self) -> bool:
        """Hold a request (up to startup_hold_s) for the fleet's first routable node."""
        try:
            async with asyncio.timeout(self.startup_hold_s):
                await self._ready.wait()
        except TimeoutError:
            return False
        return True

    def mark_failed(self, key: str, cooldown_s: float = 5.0) -> None:
        """Stop routing to the node (NodeState.key) until it heartbeats again after
        cooldown_s."""
        node = self._nodes.get(key)
        if node is not None:
            node.failed_until = self._clock() + cooldown_s

    def nodes(self) -> list[NodeState]:
        return sorted(self._nodes.values(), key=lambda n: n.key)

    def healthy(self) -> list[NodeState]:
        now = self._clock()
        return [n for n in self.nodes() if self._is_healthy(n, now)]

    def pin(self, account_id: str, session_id: str, node_key: str) -> None:
        """Keep the account's session_id on the node, which now holds its prefix cache."""
        key = (account_id, session_id)
        self._sessions[key] = node_key
        self._sessions.move_to_end(key)
        while len(self._sessions) > MAX_PINNED_SESSIONS:
            self._sessions.popitem(last=False)

    def candidates(self, model_id: str, need_bytes: int, location: tuple[float, float] | None,
                   session: tuple[str, str] | None = None, max_waiting: int = 8,
                   may_host: Callable[[NodeState], bool] | None = None) -> list[NodeState]:
        """Healthy nodes that can hold model_id (and that `may_host` admits: the capacity
        planner's placement, edgefire.gateway.routing.placement), best first. Prefill nodes
        take no requests of their own: a decode node hands them prompts (prefill_node).

        Order: nodes reporting "ok" before "degraded" ones; among them, the session's pinned
        node (session is (account id, session id); unless its queue is deep), then nodes with
        a short queue by estimated cost (latency to the client, plus COLD_LOAD_PENALTY_MS
        where the model is not loaded), then nodes with a deep queue (waiting >= max_waiting)
        in the same order, so load spills over to the next best node. Ties go to the less
        busy node, then the city code.
        """
        eligible = [n for n in self.healthy() if n.role != "prefill"
                    and n.can_hold(model_id, need_bytes) and (may_host is None or may_host(n))]
        pinned = self._sessions.get(session) if session else None

        def key(node: NodeState) -> tuple:
            # deep leads the key so that a pinned node with a deep queue spills over too.
            deep = node.waiting >= max_waiting
            cost = 0.0 if location is None else latency_ms(
                great_circle_km(location[0], location[1], node.lat, node.lon))
            if model_id not in node.loaded_models:
                cost += COLD_LOAD_PENALTY_MS
            return (node.status == "degraded", deep, node.key != pinned, cost,
                    node.running + node.waiting, node.key)

        return sorted(eligible, key=key)

    def prefill_node(self, model_id: str, need_bytes: int, decode: NodeState,
                     may_host: Callable[[NodeState], bool] | None = None) -> NodeState | None:
        """The prefill node a decode node should hand model_id's prompts to: a healthy one
        that can hold it, of the decode node's city first, then the nearest, the least busy
        of those; None when the fleet has none (the decode node then prefills itself). Only
        nodes bound to the decode node's credential: it calls them with its own secret."""
        pool = [n for n in self.healthy() if n.role == "prefill" and n.status == "ok"
                and n.credential == decode.credential
                and n.can_hold(model_id, need_bytes) and (may_host is None or may_host(n))]
        return min(pool, default=None, key=lambda n: (
            n.city != decode.city, great_circle_km(decode.lat, decode.lon, n.lat, n.lon),
            n.running + n.waiting, n.key))

    def to_json(self) -> dict:
        """The directory as JSON-ready data, for the gateway's /nodes debug view."""
        now = self._clock()
        return {
            "heartbeat_timeout_s": self.heartbeat_timeout_s,
            "nodes": [{**asdict(n), "healthy": self._is_healthy(n, now),
                       "heartbeat_age_s": round(now - n.last_heartbeat, 3)}
                      for n in self.nodes()],
        }

    def is_live(self, node: NodeState) -> bool:
        """Heard from within the heartbeat timeout (routable or not)."""
        return self._is_live(node, self._clock())

    def age_s(self, node: NodeState) -> float:
        """Seconds since node's last heartbeat."""
        return self._clock() - node.last_heartbeat

    def _is_live(self, node: NodeState, now: float) -> bool:
        return now - node.last_heartbeat <= self.heartbeat_timeout_s

    def _is_healthy(self, node: NodeState, now: float) -> bool:
        """Routable: heard from lately, not just failed, and past its own start-up."""
        return (not node.failed_until and node.status != "starting"
                and self._is_live(node, now))
