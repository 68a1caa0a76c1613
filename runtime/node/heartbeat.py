"""The node's heartbeat: tells the gateway every few seconds where it is and how busy it is.

The gateway routes only to nodes it has heard from recently, so a node that stops (or cannot
reach the gateway) drops out of routing on its own. Failures never stop the node: they are
logged at most once a minute and the next beat simply tries again.

Beats go out from a thread of their own with a blocking client, not from the event loop: a
loop kept busy (a burst of large requests) must not make a live node look dead. The thread
reads node state that the event loop and the compute thread change; what it reads is either
taken under the registry's lock or read whole (ints, list lengths: the engines' stats()).
"""

from __future__ import annotations

import logging
import threading
import time

import httpx

from edgefire.contract.headers import NODE_SECRET
from edgefire.contract.node_report import HEARTBEAT_PATH, NodeReport
from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.node.served import ServedLM

log = logging.getLogger(__name__)

WARN_EVERY_S = 60.0
# Below the gateway's default 6 s heartbeat timeout: a beat slower than that is already stale.
REQUEST_TIMEOUT_S = 5.0


class HeartbeatSender:
    def __init__(self, node: EdgeNode, gateway_url: str, public_url: str, interval_s: float,
                 secret: str | None) -> None:
        self.node = node
        self.url = gateway_url.rstrip("/") + HEARTBEAT_PATH
        self.public_url = public_url
        self.interval_s = interval_s
        self.headers = {NODE_SECRET: secret} if secret else {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._last_warning = -WARN_EVERY_S
        self._failing = False

    @classmethod
    def from_node(cls, node: EdgeNode) -> HeartbeatSender | None:
        """The sender node.settings ask for, or None when no gateway is configured."""
        s = node.settings
        if not s.gateway_url:
            return None
        public_url = s.public_url or f"http://127.0.0.1:{node.city.port}"
        return cls(node, s.gateway_url, public_url, s.heartbeat_interval_s, s.node_secret)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"heartbeat-{self.node.city.code}")
        self._thread.start()

    def stop(self) -> None:
        """Stop beating; waits for a beat in flight (at most REQUEST_TIMEOUT_S). Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=REQUEST_TIMEOUT_S + 1)
            self._thread = None

    def report(self) -> NodeReport:
        city = self.node.city
        running = waiting = 0
        kv_usage = 0.0
        for model in self.node.registry.models().values():
            if isinstance(model, ServedLM):
                stats = model.engine.stats()
                running += stats.num_running
                waiting += model.num_waiting
                kv_usage = max(kv_usage, stats.kv_usage)
        return NodeReport(
            city=city.code, name=city.name, url=self.public_url,
            lat=city.lat, lon=city.lon, role=self.node.role,
            memory_budget_bytes=city.memory_budget_bytes,
            accelerator_bytes=city.declared_accelerator_bytes,
            accelerators={"kind": city.accelerators.kind, "count": city.accelerators.count},
            loaded_models=self.node.registry.loaded(),
            running=running, waiting=waiting, kv_usage=kv_usage,
            # "degraded": a model failed lately (see EdgeNode.health); the node still serves.
            status="degraded" if self.node.registry.degraded() else "ok")

    def _run(self) -> None:
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
            while not self._stop.is_set():
                self._beat(client)
                self._stop.wait(self.interval_s)

    def _beat(self, client: httpx.Client) -> None:
        try:
            response = client.post(self.url, json=self.report().to_json(), headers=self.headers)
            response.raise_for_status()
        # Anything (a refused connection, a 500, a bug in reading engine state) must not end
        # the loop: a node that stops beating silently drops out of routing.
        except Exception as exc:
            self._failed(exc)
            return
        if self._failing:
            log.info("heartbeat to %s works again", self.url)
            self._failing = False

    def _failed(self, exc: Exception) -> None:
        self._failing = True
        now = time.monotonic()
        if now - self._last_warning >= WARN_EVERY_S:
            self._last_warning = now
            log.warning("heartbeat to %s failed (%s); retrying every %.1fs", self.url,
                        str(exc) or type(exc).__name__, self.interval_s)
        else:
            log.debug("heartbeat to %s failed: %s", self.url, exc)
