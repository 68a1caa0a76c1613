"""The last minutes of the gateway's metrics, per account, for the dashboard's charts.

Every `interval_s` the sampler reads the Prometheus registry (the very counters `GET /metrics`
exports) into a ring of samples; a series is the difference between consecutive samples:
rates for counters and, as Prometheus' histogram_quantile does, quantiles interpolated within
the histogram bucket that holds them.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from edgefire.gateway.metrics import (
    BUCKETS,
    ITL,
    LABEL,
    OUTCOMES,
    OUTPUT_TOKENS,
    REQUESTS,
    TTFT,
    GatewayMetrics,
)

INTERVAL_S = 2.0
MAX_WINDOW_S = 600
_HISTOGRAMS = {TTFT: "ttft", ITL: "itl"}


@dataclass(slots=True)
class AccountCounts:
    """One account's cumulative counts at a sample: outcomes, tokens, histogram buckets."""

    outcomes: dict[str, float] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0.0))
    tokens: float = 0.0
    # "ttft"/"itl" -> cumulative count per bucket upper bound, BUCKETS then +Inf
    buckets: dict[str, list[float]] = field(default_factory=lambda: {
        name: [0.0] * (len(BUCKETS) + 1) for name in _HISTOGRAMS.values()})


@dataclass(slots=True)
class Sample:
    t: float  # unix time
    accounts: dict[str, AccountCounts]


def read_registry(metrics: GatewayMetrics) -> dict[str, AccountCounts]:
    """Every account's counts, as the registry holds them now."""
    accounts: dict[str, AccountCounts] = {}
    bounds = [*BUCKETS, math.inf]
    for family in metrics.registry.collect():
        for s in family.samples:
            counts = accounts.setdefault(s.labels[LABEL], AccountCounts())
            if s.name == f"{REQUESTS}_total":
                counts.outcomes[s.labels["outcome"]] = s.value
            elif s.name == f"{OUTPUT_TOKENS}_total":
                counts.tokens = s.value
            elif family.name in _HISTOGRAMS and s.name.endswith("_bucket"):
                index = bounds.index(float(s.labels["le"]))
                counts.buckets[_HISTOGRAMS[family.name]][index] = s.value
    return accounts


def quantile(q: float, before: list[float], after: list[float]) -> float | None:
    """The q-quantile (seconds) of what was observed between two cumulative bucket readings;
    None when nothing was. Past the last finite bound it answers that bound."""
    counts = [b - a for a, b in zip(before, after, strict=True)]
    total = counts[-1]
    if total <= 0:
        return None
    rank, lower = q * total, 0.0
    for upper, cumulative, previous in zip(BUCKETS, counts, [0.0, *counts], strict=False):
        if cumulative >= rank:
            inside = cumulative - previous
            return lower + (upper - lower) * ((rank - previous) / inside if inside else 1.0)
        lower = upper
    return BUCKETS[-1]


class MetricsHistory:
    def __init__(self, metrics: GatewayMetrics, interval_s: float = INTERVAL_S,
                 window_s: int = MAX_WINDOW_S, clock: Callable[[], float] = time.time) -> None:
        self.metrics = metrics
        self.interval_s = interval_s
        self._clock = clock
        self._samples: deque[Sample] = deque(maxlen=int(window_s / interval_s) + 1)
        self._task: asyncio.Task | None = None

    def sample(self) -> None:
        self._samples.append(Sample(self._clock(), read_registry(self.metrics)))

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="metrics-history")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval_s)

    def series(self, account_id: str, window_s: float) -> dict:
        """The account's charts over the last window_s: one point per interval."""
        samples = [s for s in self._samples if s.t >= self._clock() - window_s - self.interval_s]
        empty = AccountCounts()
        names = ("t", "requests_per_s", "output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms",
                 "itl_p50_ms", "itl_p99_ms", "cache_hit_rate", "rate_limited", "errors")
        series: dict[str, list] = {name: [] for name in names}
        for before, after in zip(samples, samples[1:], strict=False):
            a = before.accounts.get(account_id, empty)
            b = after.accounts.get(account_id, empty)
            dt = max(after.t - before.t, 1e-9)
            moved = {k: b.outcomes[k] - a.outcomes[k] for k in OUTCOMES}
            answered = moved["ok"] + moved["cached"]
            series["t"].append(round(after.t, 3))
            series["requests_per_s"].append(sum(moved.values()) / dt)
            series["output_tokens_per_s"].append((b.tokens - a.tokens) / dt)
            for name in ("ttft", "itl"):
                for q, suffix in ((0.5, "p50"), (0.99, "p99")):
                    value = quantile(q, a.buckets[name], b.buckets[name])
                    series[f"{name}_{suffix}_ms"].append(
                        None if value is None else value * 1000)
            series["cache_hit_rate"].append(moved["cached"] / answered if answered else None)
            series["rate_limited"].append(moved["rate_limited"])
            series["errors"].append(moved["error"])
        latest = samples[-1].accounts.get(account_id, empty) if samples else empty
        totals = {"requests": sum(latest.outcomes.values()), "output_tokens": latest.tokens,
                  "cache_hits": latest.outcomes["cached"],
                  "rate_limited": latest.outcomes["rate_limited"],
                  "errors": latest.outcomes["error"]}
        return {"interval_s": self.interval_s, "window_s": window_s, "series": series,
                "totals": totals}
