"""Prometheus metrics of one app. The names are API: add new ones, never rename.

Every metric has the label `model_name` (the catalog id).

Read from each loaded text model's engine at scrape time (they restart from zero when a model
is evicted and loaded again, which Prometheus treats as a counter reset):
  edgefire_requests_running             gauge     sequences the scheduler is running
  edgefire_requests_waiting             gauge     sequences waiting to be admitted
  edgefire_kv_cache_usage_ratio         gauge     fraction of KV blocks in use, 0..1
  edgefire_kv_blocks_in_use             gauge     KV blocks held by sequences (0 when idle:
                                                  prefix-cached blocks no one holds are free)
  edgefire_prefix_cache_queries_total   counter   prompt tokens looked up in the prefix cache
  edgefire_prefix_cache_hits_total      counter   of those, tokens found in the cache
  edgefire_preemptions_total            counter   sequences preempted (recomputed later)
  (and, for a pool with a KV store behind it, edgefire.runtime.server.kv_store_metrics)

Observed by the HTTP layer, per engine request (an OpenAI `n` > 1 call makes n of them; for
those, latencies of choices after the first are measured as they are read):
  edgefire_prompt_tokens_total          counter   prompt tokens prefilled (embedding inputs too)
  edgefire_prefill_handoffs_total{outcome} counter prompts a decode node handed to a prefill
                                                  node: store | http (how the pages came) |
                                                  fallback (it failed; prefilled here)
  edgefire_generation_tokens_total      counter   tokens generated
  edgefire_requests_total{status}       counter   requests ended: success | aborted (client
                                                  gone or timed out) | error
  edgefire_time_to_first_token_seconds  histogram arrival (model load included) to first output
  edgefire_inter_token_latency_seconds  histogram between consecutive outputs of a request
  edgefire_e2e_request_latency_seconds  histogram arrival to last output, successful requests
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from edgefire.runtime.engine.outputs import RequestOutput
from edgefire.runtime.engine.stats import EngineStats
from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.node.served import ServedLM
from edgefire.runtime.server.kv_store_metrics import KVStoreCollector

LABEL = "model_name"

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class ServerMetrics:
    def __init__(self, node: EdgeNode) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(node))
        self.registry.register(KVStoreCollector(node))

        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(name, doc, [LABEL, *labels], registry=self.registry)

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, [LABEL], buckets=_LATENCY_BUCKETS,
                             registry=self.registry)

        self.prefill_handoffs = counter("edgefire_prefill_handoffs_total",
                                        "Prompts a decode node handed to a prefill node.",
                                        "outcome")
        self.prompt_tokens = counter("edgefire_prompt_tokens_total", "Prompt tokens prefilled.")
        self.generation_tokens = counter("edgefire_generation_tokens_total",
                                         "Tokens generated.")
        self.requests = counter("edgefire_requests_total", "Requests ended, by status.",
                                "status")
        self.ttft = histogram("edgefire_time_to_first_token_seconds",
                              "Arrival to first output.")
        self.itl = histogram("edgefire_inter_token_latency_seconds",
                             "Time between consecutive outputs of a request.")
        self.e2e = histogram("edgefire_e2e_request_latency_seconds",
                             "Arrival to last output of successful requests.")

    def timer(self, model_name: str, started: float | None = None) -> RequestTimer:
        return RequestTimer(self, model_name, time.perf_counter() if started is None else started)


class RequestTimer:
    """One engine (or embedding) request's latencies and outcome, recorded once."""

    __slots__ = ("_metrics", "_model", "_started", "_last", "_ended", "num_prompt_tokens")

    def __init__(self, metrics: ServerMetrics, model_name: str, started: float) -> None:
        self._metrics = metrics
        self._model = model_name
        self._started = started
        self._last: float | None = None
        self._ended = False
        self.num_prompt_tokens = 0  # counted when the first output shows the prompt was run

    def observe(self, output: RequestOutput) -> None:
        m, now = self._metrics, time.perf_counter()
        if self._last is None:
            m.ttft.labels(self._model).observe(now - self._started)
            self.prompt_processed(self.num_prompt_tokens)
        else:
            m.itl.labels(self._model).observe(now - self._last)
        self._last = now
        m.generation_tokens.labels(self._model).inc(len(output.token_ids))
        if output.finished:
            self.end("success")

    def prompt_processed(self, num_tokens: int) -> None:
        self._metrics.prompt_tokens.labels(self._model).inc(num_tokens)

    def end(self, status: str) -> None:
        """Count the request as ended with `status`; later calls change nothing."""
        if self._ended:
            return
        self._ended = True
        m = self._metrics
        m.requests.labels(self._model, status).inc()
        if status == "success":
            m.e2e.labels(self._model).observe(time.perf_counter() - self._started)


class _EngineCollector(Collector):
    def __init__(self, node: EdgeNode) -> None:
        self._node = node

    def collect(self) -> Iterator[Metric]:
        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=[LABEL])

        def counter(name: str, doc: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=[LABEL])

        running = gauge("edgefire_requests_running", "Sequences the scheduler is running.")
        waiting = gauge("edgefire_requests_waiting", "Sequences waiting to be admitted.")
        usage = gauge("edgefire_kv_cache_usage_ratio", "Fraction of KV blocks in use.")
        in_use = gauge("edgefire_kv_blocks_in_use", "KV blocks held by sequences.")
        queries = counter("edgefire_prefix_cache_queries_total",
                          "Prompt tokens looked up in the prefix cache.")
        hits = counter("edgefire_prefix_cache_hits_total",
                       "Prompt tokens found in the prefix cache.")
        preemptions = counter("edgefire_preemptions_total", "Sequences preempted.")
        drafts = counter("edgefire_spec_decode_draft_tokens_total",
                         "Speculative draft tokens verified.")
        accepted = counter("edgefire_spec_decode_accepted_tokens_total",
                           "Speculative draft tokens accepted.")
        for name, stats in _engine_stats(self._node):
            running.add_metric([name], stats.num_running)
            waiting.add_metric([name], stats.num_waiting)
            usage.add_metric([name], stats.kv_usage)
            in_use.add_metric([name], stats.num_kv_blocks_used)
            queries.add_metric([name], stats.num_prefix_queried_tokens)
            hits.add_metric([name], stats.num_prefix_hit_tokens)
            preemptions.add_metric([name], stats.num_preemptions)
            drafts.add_metric([name], stats.num_draft_tokens)
            accepted.add_metric([name], stats.num_accepted_draft_tokens)
        yield from (running, waiting, usage, in_use, queries, hits, preemptions, drafts, accepted)


def _engine_stats(node: EdgeNode) -> Iterator[tuple[str, EngineStats]]:
    for model_id, served in node.registry.models().items():
        if isinstance(served, ServedLM):
            yield model_id, served.engine.stats()
