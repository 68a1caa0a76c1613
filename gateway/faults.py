"""Fault injection: upstream calls that fail the way production fails, for testing retry and
fallback code.

A request asks with `x-edgefire-fault: capacity | rate-limit | timeout | server-error |
stream-cut`, optionally with added latency (`latency=250`, or `latency=200,capacity`); rules in
gateway.yaml (`faults:`) fail every n-th call of a model, or a seeded random share of them. A
fault takes the place of one upstream attempt (the pipeline wraps the step's provider), so the
gateway's retries, fallbacks and stream guard meet it exactly where they meet a real failure:

  capacity      the node's 429 answer, 3040              retried, then the next step
  server-error  a 500 answer, 3001                       retried, then the next step
  timeout       the attempt times out: 3007 (408)        retried, then the next step
  stream-cut    a stream ends after a few events as a killed node's does (an error event, no
                [DONE]); an unstreamed answer fails mid-body (3040)   retried unless streamed
  rate-limit    the gateway's own rate limit: 2003 (429)  never retried, as the real one
  latency=MS    the attempt starts MS later (counts toward cf-aig-request-timeout)

Off unless EDGEFIRE_FAULT_INJECTION is true (`edge-gateway dev` turns it on). Off, the header
is refused rather than ignored, so a test cannot pass against a gateway that injected nothing.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field, replace

import httpx

from edgefire.contract.catalog import Catalog
from edgefire.contract.errors import (
    CapacityError,
    ConfigError,
    EdgefireError,
    InternalError,
    InvalidInputError,
    RateLimitedError,
    UnknownModelError,
    UpstreamError,
)
from edgefire.contract.headers import FAULT
from edgefire.contract.http_errors import error_body
from edgefire.gateway.providers.base import Provider, UpstreamRequest, UpstreamResponse

KINDS = ("capacity", "rate-limit", "timeout", "server-error", "stream-cut")
MAX_LATENCY_MS = 600_000
STREAM_CUT_AFTER_EVENTS = 3  # enough for a client to have started showing the answer
_DROPPED = "peer closed connection without sending complete message body"


@dataclass(slots=True, frozen=True)
class FaultPlan:
    kind: str | None = None  # one of KINDS; None: latency only
    latency_ms: int = 0


def parse_fault(value: str | None, name: str = FAULT) -> FaultPlan | None:
    """`latency=MS` and/or one of KINDS, comma-separated; InvalidInputError naming `name`."""
    if value is None:
        return None
    kind, latency = None, None
    for item in (part.strip() for part in value.split(",")):
        key, eq, amount = item.partition("=")
        if key == "latency" and eq and latency is None:
            if not amount.isdigit() or int(amount) > MAX_LATENCY_MS:
                raise InvalidInputError(f"{name}: latency must be whole milliseconds from 0 to "
                                        f"{MAX_LATENCY_MS}", field=name)
            latency = int(amount)
        elif item in KINDS and kind is None:
            kind = item
        else:
            raise InvalidInputError(
                f"{name}: {item!r} is not a fault; give one of {', '.join(KINDS)} and/or "
                "latency=MS, comma-separated", field=name)
    return FaultPlan(kind, latency or 0)


@dataclass(slots=True)
class FaultRule:
    """A gateway.yaml rule: `plan` on every `every`-th call of `model` (None: any model), or
    on a `probability` share drawn from Random(seed), or on every call."""

    plan: FaultPlan
    model: str | None = None
    every: int | None = None
    probability: float | None = None
    rng: random.Random = field(default_factory=random.Random)
    calls: int = 0

    def fires(self) -> bool:
        self.calls += 1
        if self.every is not None:
            return self.calls % self.every == 0
        if self.probability is not None:
            return self.rng.random() < self.probability
        return True


def load_rules(entries: object, catalog: Catalog) -> list[FaultRule]:
    """gateway.yaml `faults:` as rules; ConfigError naming the bad entry."""
    if not isinstance(entries, list):
        raise ConfigError("gateway.yaml faults: must be a list of rules", field="faults")
    return [_rule(entry, catalog, f"faults[{index}]") for index, entry in enumerate(entries)]


def _rule(entry: object, catalog: Catalog, where: str) -> FaultRule:
    known = {"model", "fault", "every", "probability", "seed"}
    if not isinstance(entry, dict) or not set(entry) <= known or "fault" not in entry:
        raise ConfigError(f"gateway.yaml {where} must be a mapping with `fault` and optionally "
                          "`model`, then `every` or `probability` (with `seed`)", field=where)
    try:
        plan = parse_fault(str(entry["fault"]), f"gateway.yaml {where}.fault")
    except InvalidInputError as exc:
        raise ConfigError(exc.message, field=where) from None
    every, probability = entry.get("every"), entry.get("probability")
    if every is not None and probability is not None:
        raise ConfigError(f"gateway.yaml {where}: give `every` or `probability`, not both",
                          field=where)
    if every is not None and (type(every) is not int or every < 1):
        raise ConfigError(f"gateway.yaml {where}.every must be a positive integer", field=where)
    if probability is not None and (isinstance(probability, bool) or not isinstance(
            probability, int | float) or not 0 < probability <= 1):
        raise ConfigError(f"gateway.yaml {where}.probability must be in (0, 1]", field=where)
    seed = entry.get("seed", 0)
    if type(seed) is not int:
        raise ConfigError(f"gateway.yaml {where}.seed must be an integer", field=where)
    model = entry.get("model")
    return FaultRule(plan, _canonical(catalog, str(model)) if model is not None else None,
                     every, probability, random.Random(seed))


def _canonical(catalog: Catalog, model: str) -> str:
    """An alias matches the same rules as its model's id; ids outside the catalog as spelt."""
    try:
        return catalog.get(model).id
    except UnknownModelError:
        return model


class FaultInjector:
    def __init__(self, enabled: bool, rules: list[FaultRule], catalog: Catalog) -> None:
        if rules and not enabled:
            raise ConfigError("gateway.yaml has faults: rules but fault injection is off; set "
                              "EDGEFIRE_FAULT_INJECTION=true (edge-gateway dev sets it)",
                              field="faults")
        self.enabled = enabled
        self.rules = rules
        self.catalog = catalog

    def check(self, plans: Iterable[FaultPlan | None]) -> None:
        """Refuse a request that asks for a fault while injection is off (before any call)."""
        if not self.enabled and any(plan is not None for plan in plans):
            raise InvalidInputError(f"{FAULT} is refused: fault injection is off on this gateway "
                                    "(set EDGEFIRE_FAULT_INJECTION=true; edge-gateway dev has "
                                    "it on)", field=FAULT)

    def wrap(self, provider: Provider, plan: FaultPlan | None, model: str | None,
             openai: bool) -> Provider:
        """provider, failing as `plan` says (the request's header) or as a matching rule fires
        per attempt; provider itself when neither can apply. `openai`: the upstream answers
        in OpenAI's error shape rather than Workers AI's envelope."""
        if not self.enabled:
            return provider
        rules = [] if plan is not None else self._rules_for(model)
        if plan is None and not rules:
            return provider
        return _Faulty(provider, plan, rules, openai)

    def _rules_for(self, model: str | None) -> list[FaultRule]:
        canonical = _canonical(self.catalog, model) if model else None
        return [rule for rule in self.rules if rule.model is None or rule.model == canonical]


@dataclass(slots=True)
class _Faulty:
    inner: Provider
    plan: FaultPlan | None
    rules: list[FaultRule]
    openai: bool

    @property
    def name(self) -> str:
        return self.inner.name

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        plan = self.plan if self.plan is not None else next(
            (rule.plan for rule in self.rules if rule.fires()), None)  # the first that fires
        if plan is None:
            return await self.inner.send(request)
        if plan.latency_ms:
            await asyncio.sleep(plan.latency_ms / 1000)
        match plan.kind:
            case "capacity":
                return self._answer(CapacityError())
            case "server-error":
                return self._answer(InternalError())
            case "rate-limit":
                raise RateLimitedError("Rate limit exceeded (fault injected by "
                                       f"{FAULT} or a gateway.yaml rule)")
            case "timeout":
                raise TimeoutError  # as the attempt's own timer would: retries make it 3007
            case "stream-cut" if not request.stream:
                raise UpstreamError("upstream failed mid-response: RemoteProtocolError")
            case "stream-cut":
                return _cut(await self.inner.send(request))
        return await self.inner.send(request)

    def _answer(self, error: EdgefireError) -> UpstreamResponse:
        # Serialised as the node's JSONResponse serialises its errors.
        body = json.dumps(error_body(error, self.openai), ensure_ascii=False,
                          separators=(",", ":")).encode()
        return UpstreamResponse(error.status, {"content-type": "application/json"}, body)


def _cut(response: UpstreamResponse) -> UpstreamResponse:
    if response.chunks is None:  # an error answer, not a stream: nothing to cut
        return response
    return replace(response, chunks=_cut_events(response.chunks, STREAM_CUT_AFTER_EVENTS))


async def _cut_events(chunks: AsyncIterator[bytes], after: int) -> AsyncIterator[bytes]:
    """The first `after` events (never [DONE]) and half of the next, then the connection
    drops: the bytes the gateway reads from a node killed mid-answer."""
    pending, sent = b"", 0
    async for chunk in chunks:
        pending += chunk
        while (end := pending.find(b"\n\n")) >= 0:
            event, pending = pending[:end + 2], pending[end + 2:]
            if sent == after or event.startswith(b"data: [DONE]"):
                yield event[:len(event) // 2]
                raise httpx.RemoteProtocolError(_DROPPED)
            yield event
            sent += 1
    raise httpx.RemoteProtocolError(_DROPPED)
