"""Retries and timeouts per request: the cf-aig-max-attempts, -retry-delay, -backoff and
-request-timeout headers, or a universal step's config."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace

from edgefire.contract.errors import InvalidInputError, RequestTimeoutError, UpstreamError
from edgefire.gateway.providers.base import Provider, UpstreamRequest, UpstreamResponse

BACKOFFS = ("constant", "linear", "exponential")


@dataclass(slots=True, frozen=True)
class RetryPolicy:
    max_attempts: int = 1
    retry_delay_ms: int = 0
    backoff: str = "constant"
    request_timeout_ms: int | None = None  # to the first byte of the answer

    def delay_s(self, retry: int) -> float:
        """Wait before retry number `retry` (1 for the first retry)."""
        factor = {"constant": 1, "linear": retry, "exponential": 2 ** (retry - 1)}[self.backoff]
        return self.retry_delay_ms * factor / 1000

    def overridden(self, headers: Mapping[str, str] | None = None,
                   config: Mapping[str, object] | None = None) -> RetryPolicy:
        """This policy with a universal step's `config`, then request headers, applied."""
        values = {}
        for key, field, parse in _FIELDS:
            if config and key in config:
                values[field] = parse(config[key], key)
            header = f"cf-aig-{_kebab(key)}"
            if headers and header in headers:
                values[field] = parse(headers[header], header)
        return replace(self, **values)


def _int_in(low: int, high: int):
    def parse(value: object, name: str) -> int:
        try:
            number = int(str(value))
        except ValueError:
            number = low - 1
        if not low <= number <= high:
            raise InvalidInputError(f"{name} must be an integer from {low} to {high}", field=name)
        return number

    return parse


def _backoff(value: object, name: str) -> str:
    if value not in BACKOFFS:
        raise InvalidInputError(f"{name} must be one of {', '.join(BACKOFFS)}", field=name)
    return str(value)


def _kebab(key: str) -> str:
    return "".join(f"-{c.lower()}" if c.isupper() else c for c in key)


# (universal-step config key, RetryPolicy field, parser); headers are cf-aig-<kebab key>.
_FIELDS = (
    ("maxAttempts", "max_attempts", _int_in(1, 5)),
    ("retryDelay", "retry_delay_ms", _int_in(0, 5000)),
    ("backoff", "backoff", _backoff),
    ("requestTimeout", "request_timeout_ms", _int_in(1, 600_000)),
)


async def send_with_retries(provider: Provider, request: UpstreamRequest, policy: RetryPolicy,
                            before_attempt: Callable[[], Awaitable[None]] | None = None,
                            ) -> UpstreamResponse:
    """The first good answer; after the last attempt, its error answer or its exception.

    before_attempt runs before each call (the pipeline charges it to the rate limit; it may
    raise to stop). A timed-out call is cancelled, which closes its upstream connection, so
    the node sees the disconnect and stops generating.
    """
    timeout = policy.request_timeout_ms / 1000 if policy.request_timeout_ms else None
    failure: Exception | UpstreamResponse | None = None
    for attempt in range(policy.max_attempts):
        if attempt:
            await asyncio.sleep(policy.delay_s(attempt))
        if before_attempt is not None:
            await before_attempt()
        try:
            response = await asyncio.wait_for(provider.send(request), timeout)
        except TimeoutError:
            failure = RequestTimeoutError()
            continue
        except UpstreamError as exc:
            failure = exc
            continue
        if response.status >= 500 or response.status == 429:
            failure = response  # worth another try; kept to answer with if none succeeds
            continue
        return response
    if isinstance(failure, UpstreamResponse):
        return failure
    raise failure if failure is not None else UpstreamError("no attempt was made")
