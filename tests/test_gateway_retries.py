"""Retries, backoff and the request timeout of gateway steps (cf-aig-* headers, step config)."""

from __future__ import annotations

import asyncio

import pytest

from edgefire.contract.errors import InvalidInputError, RequestTimeoutError, UpstreamError
from edgefire.gateway.providers.base import UpstreamRequest, UpstreamResponse
from edgefire.gateway.retries import RetryPolicy, send_with_retries

REQUEST = UpstreamRequest("acct", "@cf/x", b"{}")


class Flaky:
    """Answers with `script`, one item per call: an exception, a status, or a delay."""

    name = "flaky"

    def __init__(self, *script: object) -> None:
        self.script = list(script)
        self.calls = 0

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        self.calls += 1
        item = self.script.pop(0)
        if isinstance(item, Exception):
            raise item
        if isinstance(item, float):
            await asyncio.sleep(item)
            item = 200
        return UpstreamResponse(item, {}, b"{}")


def _send(provider: Flaky, policy: RetryPolicy) -> UpstreamResponse:
    return asyncio.run(send_with_retries(provider, REQUEST, policy))


def test_retries_until_an_answer_that_is_not_a_failure():
    provider = Flaky(UpstreamError("down"), 503, 200)
    assert _send(provider, RetryPolicy(max_attempts=3)).status == 200
    assert provider.calls == 3


def test_after_the_last_attempt_the_last_failure_is_returned_or_raised():
    assert _send(Flaky(503, 502), RetryPolicy(max_attempts=2)).status == 502
    with pytest.raises(UpstreamError):
        _send(Flaky(503, UpstreamError("down")), RetryPolicy(max_attempts=2))


def test_client_errors_are_not_retried():
    provider = Flaky(400, 200)
    assert _send(provider, RetryPolicy(max_attempts=3)).status == 400 and provider.calls == 1


def test_request_timeout_counts_to_the_answer():
    with pytest.raises(RequestTimeoutError):
        _send(Flaky(0.5), RetryPolicy(request_timeout_ms=50))
    assert _send(Flaky(0.5, 200), RetryPolicy(max_attempts=2, request_timeout_ms=50)).ok


@pytest.mark.parametrize(("backoff", "delays"), [("constant", [0.1, 0.1, 0.1]),
                                                 ("linear", [0.1, 0.2, 0.3]),
                                                 ("exponential", [0.1, 0.2, 0.4])])
def test_backoff_delays(backoff, delays):
    policy = RetryPolicy(max_attempts=4, retry_delay_ms=100, backoff=backoff)
    assert [policy.delay_s(n) for n in (1, 2, 3)] == pytest.approx(delays)


def test_headers_override_step_config_and_are_validated():
    policy = RetryPolicy().overridden({"cf-aig-max-attempts": "4", "cf-aig-backoff": "linear"},
                                      {"maxAttempts": 2, "retryDelay": 250})
    assert (policy.max_attempts, policy.retry_delay_ms, policy.backoff) == (4, 250, "linear")
    for headers in ({"cf-aig-max-attempts": "9"}, {"cf-aig-retry-delay": "6000"},
                    {"cf-aig-backoff": "random"}, {"cf-aig-request-timeout": "soon"}):
        with pytest.raises(InvalidInputError) as caught:
            RetryPolicy().overridden(headers)
        assert caught.value.field == next(iter(headers))
