"""One gateway request: rate limit, cache, provider steps with retries and fallback, log.

Steps are tried in order (one step for the provider URL forms, several for the universal
endpoint); a step that cannot be reached, times out, or answers 5xx/429 hands over to the next.
A streamed answer is passed through as it arrives and logged when it ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import anyio
from starlette.responses import Response, StreamingResponse

from edgefire.contract.catalog import Catalog
from edgefire.contract.errors import (
    EdgefireError,
    InvalidInputError,
    NotFoundError,
    RateLimitedError,
    RequestTimeoutError,
    UnknownModelError,
    UpstreamError,
)
from edgefire.contract.headers import FAULT, NODE, PROMPT_TOKENS, STAND_IN
from edgefire.contract.http_errors import is_openai_path
from edgefire.gateway.cache import (
    CachedResponse,
    CachePolicy,
    ResponseCache,
    cache_key,
    parse_cache_headers,
)
from edgefire.gateway.faults import FaultInjector, FaultPlan, parse_fault
from edgefire.gateway.gateways import GatewayConfig
from edgefire.gateway.logs import (
    BodyCapture,
    LogRecord,
    LogStore,
    captured_body,
    scalar_object,
)
from edgefire.gateway.metrics import GatewayMetrics
from edgefire.gateway.pricing import apply_custom_cost, cost_usd, parse_custom_cost
from edgefire.gateway.providers.base import Provider, UpstreamRequest, UpstreamResponse
from edgefire.gateway.ratelimit import RateLimiter
from edgefire.gateway.retries import RetryPolicy, send_with_retries
from edgefire.gateway.stream_guard import guarded
from edgefire.gateway.usage import StreamMeter, Tokens, tokens_from_json

log = logging.getLogger(__name__)

_TAIL_BYTES = 8192  # enough of a stream's end to find its usage event
# Upstream calls one request may cause, over its steps and their retries: each step may ask
# for up to 5 attempts, so without a total a 10-step request could cost 50 upstream calls.
MAX_ATTEMPTS = 10


@dataclass(slots=True)
class Step:
    provider: str
    request: UpstreamRequest
    model: str | None
    retry: RetryPolicy
    headers: Mapping[str, str]  # cache/log headers for this step (step-level ones win)
    # cf-aig-metadata and cf-aig-custom-cost, parsed when the step is made: a bad one is a 400
    # before any upstream call, not an error after the answer.
    metadata: dict = field(default_factory=dict)
    custom_cost: dict | None = None
    fault: FaultPlan | None = None  # x-edgefire-fault (edgefire.gateway.faults)

    @classmethod
    def of(cls, provider: str, request: UpstreamRequest, model: str | None, retry: RetryPolicy,
           headers: Mapping[str, str]) -> Step:
        return cls(provider, request, model, retry, headers, parse_metadata(headers),
                   parse_custom_cost(headers.get("cf-aig-custom-cost")),
                   parse_fault(headers.get(FAULT)))


@dataclass(slots=True)
class GatewayRequest:
    account_id: str
    gateway: GatewayConfig | None  # None: a plain Workers AI call, no gateway features
    path: str
    request_type: str
    steps: list[Step]
    universal: bool = False


@dataclass(slots=True)
class _Answer:
    response: UpstreamResponse
    step: int
    cached: bool


class Pipeline:
    def __init__(self, providers: dict[str, Provider], cache: ResponseCache,
                 limiter: RateLimiter, logs: LogStore, catalog: Catalog,
                 faults: FaultInjector | None = None,
                 metrics: GatewayMetrics | None = None) -> None:
        self.providers = providers
        self.cache = cache
        self.limiter = limiter
        self.logs = logs
        self.catalog = catalog
        self.faults = faults or FaultInjector(False, [], catalog)
        self.metrics = metrics or GatewayMetrics()

    async def handle(self, request: GatewayRequest) -> Response:
        started = time.perf_counter()
        try:
            check_attempts(request)
            self.faults.check(step.fault for step in request.steps)
            await self._charge(request)  # the request itself, answered from the cache or not
            answer = await self._first_answer(request)
        except EdgefireError as exc:
            self.metrics.refused(request.account_id, isinstance(exc, RateLimitedError))
            raise
        return self._respond(request, answer, started)

    async def _charge(self, request: GatewayRequest) -> None:
        gateway = request.gateway
        if gateway is not None and gateway.rate_limiting_limit:
            decision = await self.limiter.hit(
                f"{request.account_id}:{gateway.id}", gateway.rate_limiting_limit,
                gateway.rate_limiting_interval or 60, gateway.rate_limiting_technique)
            if not decision.allowed:
                raise RateLimitedError(f"Rate limit exceeded for gateway {gateway.id}; retry in "
                                       f"{decision.retry_after_s:.0f}s")

    async def _first_answer(self, request: GatewayRequest) -> _Answer:
        failure: Exception | None = None
        kept: _Answer | None = None
        attempts = 0

        async def before_attempt() -> None:
            # The request's own charge covers its first upstream call; every later one (a
            # retry, a fallback step) is charged too, so retries cannot multiply the limit.
            nonlocal attempts
            attempts += 1
            if attempts > 1:
                await self._charge(request)

        for index, step in enumerate(request.steps):
            try:
                answer = await self._fetch(request, step, index, before_attempt)
            except (UpstreamError, RequestTimeoutError) as exc:
                failure = exc
                continue
            if answer.response.status < 500 and answer.response.status != 429:
                return answer
            kept = answer
        if kept is not None:
            return kept
        assert failure is not None, "a gateway request has at least one step"
        raise failure

    async def _fetch(self, request: GatewayRequest, step: Step, index: int,
                     before_attempt: Callable[[], Awaitable[None]]) -> _Answer:
        provider = self.providers.get(step.provider)
        if provider is None:
            raise InvalidInputError(f"unknown provider {step.provider!r}", field="provider")
        policy = self._cache_policy(request, step)
        key = None
        if policy.enabled and not policy.skip and not step.request.stream:
            key = cache_key(request.account_id, request.gateway.id, step.provider,
                            step.request.path, step.request.body, policy.custom_key)
            hit = await self.cache.get(key)
            if hit is not None:
                return _Answer(UpstreamResponse(hit.status, hit.headers, hit.body), index, True)
        # An injected fault takes the place of an upstream attempt, inside the retries.
        provider = self.faults.wrap(provider, step.fault, step.model, _speaks_openai(step))
        response = await send_with_retries(provider, step.request, step.retry, before_attempt)
        if key is not None and response.status == 200:
            await self.cache.set(key, CachedResponse(response.status, response.headers,
                                                     response.body), policy.ttl_s)
        return _Answer(response, index, False)

    def _cache_policy(self, request: GatewayRequest, step: Step) -> CachePolicy:
        if request.gateway is None:
            return CachePolicy(enabled=False, ttl_s=None, skip=True, custom_key=None)
        return parse_cache_headers(step.headers, request.gateway.cache_ttl)

    def _respond(self, request: GatewayRequest, answer: _Answer, started: float) -> Response:
        step = request.steps[answer.step]
        upstream = answer.response
        headers = dict(upstream.headers)
        if request.gateway is not None:
            headers["cf-aig-cache-status"] = "HIT" if answer.cached else "MISS"
        if request.universal:
            headers["cf-aig-step"] = str(answer.step)
        if upstream.node:
            headers[NODE] = upstream.node
        record = self._log_record(request, answer, step) if self._collect(request, step) else None
        if record is not None:
            headers["cf-aig-log-id"] = record.id
        if upstream.chunks is None:
            tokens = tokens_from_json(upstream.body)
            self.metrics.answered(request.account_id, upstream.status, answer.cached,
                                  tokens.tokens_out, started)
            if record is not None:
                record.response_body = captured_body(upstream.body)
                self._finish_log(record, step, tokens, started)
            return Response(upstream.body, upstream.status, headers)
        relay = self._relay(request.account_id, upstream, record, step, started,
                            is_openai_path(request.path))
        return StreamingResponse(relay, upstream.status, headers)

    async def _relay(self, account_id: str, upstream: UpstreamResponse,
                     record: LogRecord | None, step: Step, started: float,
                     openai: bool) -> AsyncIterator[bytes]:
        tail = b""
        meter = StreamMeter(upstream.headers.get(PROMPT_TOKENS))
        clock = self.metrics.stream_clock(account_id, started)
        head = BodyCapture() if record is not None else None
        try:
            async for chunk in guarded(upstream.chunks, upstream.headers, openai):
                tail = (tail + chunk)[-_TAIL_BYTES:]
                meter.feed(chunk)
                clock.events(meter.text_events)
                if head is not None:
                    head.feed(chunk)
                yield chunk
        finally:
            # A client that leaves cancels this body; the upstream and the log still close.
            with anyio.CancelScope(shield=True):
                if upstream.close is not None:
                    await upstream.close()
                tokens = meter.tokens(tail)
                self.metrics.answered(account_id, upstream.status, False, tokens.tokens_out,
                                      started)
                if record is not None and head is not None:
                    record.response_body = head.text()
                    self._finish_log(record, step, tokens, started)

    def _collect(self, request: GatewayRequest, step: Step) -> bool:
        if request.gateway is None:
            return False
        override = step.headers.get("cf-aig-collect-log")
        if override is not None:
            return override.lower() == "true"
        return request.gateway.collect_logs

    def _log_record(self, request: GatewayRequest, answer: _Answer, step: Step) -> LogRecord:
        return LogRecord(
            account_id=request.account_id, gateway_id=request.gateway.id, provider=step.provider,
            model=step.model or "", path=request.path, request_type=request.request_type,
            status_code=answer.response.status, success=answer.response.ok,
            cached=answer.cached, metadata=step.metadata,
            step=answer.step if request.universal else None, node=answer.response.node,
            stand_in=answer.response.headers.get(STAND_IN),
            request_body=captured_body(step.request.body))

    def _finish_log(self, record: LogRecord, step: Step, tokens: Tokens, started: float) -> None:
        record.tokens_in, record.tokens_out = tokens.tokens_in, tokens.tokens_out
        record.duration_ms = round((time.perf_counter() - started) * 1000)
        record.cost = self._cost(step, tokens)
        try:
            self.logs.add(record)
        except NotFoundError:  # the gateway was deleted while the request ran; so are its logs
            log.info("log %s dropped: gateway %s is gone", record.id, record.gateway_id)

    def _cost(self, step: Step, tokens: Tokens) -> float | None:
        if step.custom_cost is not None:
            return apply_custom_cost(step.custom_cost, tokens.tokens_in, tokens.tokens_out)
        try:
            price = self.catalog.get(step.model).extra.get("price") if step.model else None
        except UnknownModelError:
            price = None
        return cost_usd(price, tokens.tokens_in, tokens.tokens_out, tokens.cached_in)


def _speaks_openai(step: Step) -> bool:
    """Whether the step's upstream answers errors in OpenAI's shape: every provider does but
    the fleet on its native run path (`@cf/…`, not `v1/…`)."""
    return step.provider != "workers-ai" or step.request.path.lstrip("/").startswith("v1/")


def check_attempts(request: GatewayRequest) -> None:
    """5006 naming the step past which the request would exceed MAX_ATTEMPTS upstream calls
    (the steps' maxAttempts, or cf-aig-max-attempts, added up): refused before any call.
    Only the universal endpoint has several steps, so only it can get there."""
    total = 0
    for index, step in enumerate(request.steps):
        total += step.retry.max_attempts
        if total > MAX_ATTEMPTS:
            where = f"body[{index}]"
            raise InvalidInputError(
                f"a request may make at most {MAX_ATTEMPTS} upstream attempts over all its steps "
                f"and retries; {where} brings the steps' maxAttempts (cf-aig-max-attempts) to "
                f"{total}", field=where)


def parse_metadata(headers: Mapping[str, str]) -> dict:
    """cf-aig-metadata: a JSON object of up to 5 scalar entries (extra entries are dropped)."""
    raw = headers.get("cf-aig-metadata")
    if raw is None:
        return {}
    return dict(list(scalar_object(raw, "cf-aig-metadata").items())[:5])
