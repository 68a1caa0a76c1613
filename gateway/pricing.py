"""Request cost: catalog prices per million tokens, or a per-request `cf-aig-custom-cost`."""

from __future__ import annotations

import json
import math

from edgefire.contract.errors import InvalidInputError

CUSTOM_COST_HEADER = "cf-aig-custom-cost"
_UNITS = {
    "per M input tokens": "input",
    "per M cached input tokens": "cached",
    "per M output tokens": "output",
}
_PER_TOKEN_KEYS = frozenset({"per_token_in", "per_token_out"})


def cost_usd(spec_extra_price: list[dict] | None, tokens_in: int, tokens_out: int,
             cached_in: int = 0) -> float | None:
    """The USD cost of a request from a catalog `price` list; None when the model has no price.

    `cached_in` counts the prompt tokens served from the prefix cache; like OpenAI's
    `cached_tokens` they are part of `tokens_in`, billed at the cached rate instead.
    A malformed price list is a catalog bug, so it raises ValueError rather than costing zero.
    """
    if not spec_extra_price:
        return None
    # Counts come from upstream usage reports: an inconsistent one must not fail the request's
    # logging, so it is bounded to what can be billed.
    tokens_in, tokens_out = max(tokens_in, 0), max(tokens_out, 0)
    cached_in = min(max(cached_in, 0), tokens_in)
    rates: dict[str, float] = {}
    for entry in spec_extra_price:
        kind = _UNITS.get(entry.get("unit"))
        if kind is None:
            raise ValueError(f"unknown price unit {entry.get('unit')!r}")
        if entry.get("currency", "USD") != "USD":
            raise ValueError(f"price {entry!r} is not in USD")
        rates[kind] = float(entry["price"])
    input_rate = rates.get("input", 0.0)
    # Without a cached-input price, cached tokens are ordinary input tokens.
    cached_rate = rates.get("cached", input_rate)
    total = ((tokens_in - cached_in) * input_rate + cached_in * cached_rate
             + tokens_out * rates.get("output", 0.0))
    return total / 1_000_000


def _amount(value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value < 0:
        raise InvalidInputError(f"{CUSTOM_COST_HEADER}: {key} must be a non-negative number",
                                field=CUSTOM_COST_HEADER)
    return float(value)


def parse_custom_cost(header_value: str | None) -> dict | None:
    """The parsed `cf-aig-custom-cost` header: `{"per_token_in", "per_token_out"}` (either may be
    omitted, meaning 0) or `{"total_cost"}`; None when the header is absent or empty."""
    if header_value is None or not header_value.strip():
        return None
    try:
        body = json.loads(header_value)
    except (ValueError, RecursionError):
        raise InvalidInputError(f"{CUSTOM_COST_HEADER} must be a JSON object",
                                field=CUSTOM_COST_HEADER) from None
    if not isinstance(body, dict):
        raise InvalidInputError(f"{CUSTOM_COST_HEADER} must be a JSON object",
                                field=CUSTOM_COST_HEADER)
    keys = set(body)
    if keys == {"total_cost"}:
        return {"total_cost": _amount(body["total_cost"], "total_cost")}
    if keys and keys <= _PER_TOKEN_KEYS:
        return {key: _amount(body.get(key, 0), key) for key in sorted(_PER_TOKEN_KEYS)}
    raise InvalidInputError(f"{CUSTOM_COST_HEADER} takes either total_cost or per_token_in and "
                            f"per_token_out, got {sorted(keys)}", field=CUSTOM_COST_HEADER)


def apply_custom_cost(custom: dict, tokens_in: int, tokens_out: int) -> float:
    """The cost a parsed custom-cost header assigns to a request with these token counts."""
    if "total_cost" in custom:
        return custom["total_cost"]
    return custom["per_token_in"] * tokens_in + custom["per_token_out"] * tokens_out
