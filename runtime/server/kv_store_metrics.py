"""Prometheus metrics of the KV store tier behind each loaded model's page pool (names are
API, as in edgefire.runtime.server.metrics; label `model_name`). Read at scrape time:
  edgefire_prefix_cache_remote_hits_total   counter   prefix-cache hit tokens whose pages
                                                      came from the store (the rest: local)
  edgefire_kv_store_up                      gauge     1 while the store answers, else 0
  edgefire_kv_store_pages_written_total     counter   pages written to the store
  edgefire_kv_store_pages_read_total        counter   pages read whole from the store
  edgefire_kv_store_pages_rejected_total    counter   pages found damaged or of another layout
  edgefire_kv_store_pages_dropped_total     counter   pages not written (store down, queue full)
  edgefire_kv_store_bytes_written_total     counter   record bytes written
  edgefire_kv_store_bytes_read_total        counter   record bytes read
  edgefire_kv_store_latency_seconds         histogram one store call (a batch of pages)
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.node.served import ServedLM

LABEL = "model_name"
_COUNTERS = (
    ("pages_written", "num_pages_written", "Pages written to the KV store."),
    ("pages_read", "num_pages_read", "Pages read whole from the KV store."),
    ("pages_rejected", "num_pages_rejected", "Pages refused: damaged or of another layout."),
    ("pages_dropped", "num_pages_dropped", "Pages not written: store unavailable or busy."),
    ("bytes_written", "num_bytes_written", "Page record bytes written to the KV store."),
    ("bytes_read", "num_bytes_read", "Page record bytes read from the KV store."),
)


class KVStoreCollector(Collector):
    def __init__(self, node: EdgeNode) -> None:
        self._node = node

    def collect(self) -> Iterator[Metric]:
        remote_hits = CounterMetricFamily(
            "edgefire_prefix_cache_remote_hits_total",
            "Prefix-cache hit tokens whose pages came from the KV store.", labels=[LABEL])
        up = GaugeMetricFamily("edgefire_kv_store_up", "1 while the KV store answers.",
                               labels=[LABEL])
        counters = {attr: CounterMetricFamily(f"edgefire_kv_store_{name}_total", doc,
                                              labels=[LABEL])
                    for name, attr, doc in _COUNTERS}
        latency = HistogramMetricFamily("edgefire_kv_store_latency_seconds",
                                        "One KV store call (a batch of pages).", labels=[LABEL])
        for model_id, served in self._node.registry.models().items():
            if not isinstance(served, ServedLM) or (tier := served.engine.remote_tier) is None:
                continue
            stats = tier.stats
            remote_hits.add_metric([model_id],
                                   served.engine.stats().num_prefix_remote_hit_tokens)
            up.add_metric([model_id], 1 if tier.available else 0)
            for attr, family in counters.items():
                family.add_metric([model_id], getattr(stats, attr))
            latency.add_metric([model_id], stats.latency.cumulative(), stats.latency.sum_s)
        yield from (remote_hits, up, *counters.values(), latency)
