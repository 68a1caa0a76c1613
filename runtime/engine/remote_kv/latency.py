"""A latency histogram kept by plain counters, for the metrics collector to read at scrape."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)


@dataclass(slots=True)
class LatencyHistogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_S) + 1))
    sum_s: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS_S, seconds)] += 1
        self.sum_s += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus buckets: (upper bound, observations at or below it), +Inf last."""
        total, out = 0, []
        for bound, count in zip((*map(str, BUCKETS_S), "+Inf"), self.counts, strict=True):
            total += count
            out.append((bound, total))
        return out
