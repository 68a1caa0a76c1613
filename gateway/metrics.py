"""Prometheus metrics of the gateway, per account, as its clients see each inference answer.
The names are API: add new ones, never rename.

Every metric has the label `account`. Observed by the pipeline after authentication, so a
stranger cannot move another account's numbers:
  edgefire_gateway_requests_total{outcome}  counter   answered requests: ok | cached | error |
                                                      rate_limited
  edgefire_gateway_output_tokens_total      counter   tokens answered (usage, or counted events)
  edgefire_gateway_time_to_first_token_seconds  histogram  request start to a stream's first
                                                      text event
  edgefire_gateway_inter_token_latency_seconds  histogram  between text events of a stream; a
                                                      chunk that carries k events counts its
                                                      gap as k gaps of gap/k
  edgefire_gateway_request_duration_seconds histogram request start to the end of the answer

The dashboard's charts read the same objects (edgefire.gateway.metrics_history).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram

LABEL = "account"
OUTCOMES = ("ok", "cached", "error", "rate_limited")
BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
           7.5, 10.0, 20.0, 40.0, 80.0)
REQUESTS = "edgefire_gateway_requests"
OUTPUT_TOKENS = "edgefire_gateway_output_tokens"
TTFT = "edgefire_gateway_time_to_first_token_seconds"
ITL = "edgefire_gateway_inter_token_latency_seconds"
DURATION = "edgefire_gateway_request_duration_seconds"


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(REQUESTS, "Answered inference requests, by outcome.",
                                [LABEL, "outcome"], registry=self.registry)
        self.output_tokens = Counter(OUTPUT_TOKENS, "Tokens answered.", [LABEL],
                                     registry=self.registry)

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, [LABEL], buckets=BUCKETS, registry=self.registry)

        self.ttft = histogram(TTFT, "Request start to a stream's first text event.")
        self.itl = histogram(ITL, "Time between text events of a stream.")
        self.duration = histogram(DURATION, "Request start to the end of the answer.")

    def refused(self, account_id: str, rate_limited: bool) -> None:
        """A request that got no upstream answer (rate limited, or an error raised)."""
        self.requests.labels(account_id, "rate_limited" if rate_limited else "error").inc()

    def answered(self, account_id: str, status: int, cached: bool, tokens_out: int,
                 started: float) -> None:
        outcome = "error" if status >= 400 else "cached" if cached else "ok"
        self.requests.labels(account_id, outcome).inc()
        if tokens_out:
            self.output_tokens.labels(account_id).inc(tokens_out)
        self.duration.labels(account_id).observe(time.perf_counter() - started)

    def stream_clock(self, account_id: str, started: float) -> StreamClock:
        return StreamClock(self, account_id, started)


@dataclass(slots=True)
class StreamClock:
    """One relayed stream's token timing: TTFT at its first text event, then the gaps."""

    metrics: GatewayMetrics
    account_id: str
    started: float
    seen: int = 0
    last: float = field(default=0.0)

    def events(self, total: int) -> None:
        """The stream has relayed `total` text events so far."""
        new = total - self.seen
        if new <= 0:
            return
        now = time.perf_counter()
        if self.seen == 0:
            self.metrics.ttft.labels(self.account_id).observe(now - self.started)
            new -= 1
        else:
            gap = (now - self.last) / new
            itl = self.metrics.itl.labels(self.account_id)
            for _ in range(new):
                itl.observe(gap)
        self.seen, self.last = total, now
