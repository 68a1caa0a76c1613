"""The gateway's own request schemas (JSON Schema 2020-12): AI Gateway settings and universal
endpoint steps. The inference bodies it forwards and the heartbeat are the node's
(edgefire.contract.schemas).

Bodies are checked against these before anything reads them (edgefire.gateway.gateways, the
universal route), and edgefire.gateway.openapi documents these same dicts.
"""

from __future__ import annotations

MAX_STEPS = 10  # universal-endpoint steps per request
MIN_CACHE_TTL = 60
MAX_CACHE_TTL = 30 * 24 * 3600  # one month

# Rate limits past a 32-bit count are a mistake (and SQLite stores no integer past int64).
_COUNT = {"type": ["integer", "null"], "minimum": 0, "maximum": 2**31 - 1}

GATEWAY_SETTINGS = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "pattern": "^[a-z0-9_-]{1,64}$",
               "description": "1-64 characters of a-z, 0-9, '-' and '_'"},
        "cache_ttl": {
            "type": ["integer", "null"],
            "anyOf": [{"maximum": 0}, {"minimum": MIN_CACHE_TTL, "maximum": MAX_CACHE_TTL}],
            "minimum": 0,
            "description": f"0 (off) or {MIN_CACHE_TTL}..{MAX_CACHE_TTL} seconds",
        },
        "cache_invalidate_on_update": {"type": "boolean"},
        "collect_logs": {"type": "boolean"},
        "rate_limiting_limit": _COUNT,
        "rate_limiting_interval": _COUNT,
        "rate_limiting_technique": {"enum": ["fixed", "sliding"]},
        "authentication": {"type": "boolean"},
        # Returned by GET, so clients that PUT back what they read send them; not settable.
        "created_at": {"readOnly": True},
        "modified_at": {"readOnly": True},
    },
    "additionalProperties": False,
}

GATEWAY_CREATE = {**GATEWAY_SETTINGS, "required": ["id"]}

UNIVERSAL_STEPS = {
    "type": "array", "minItems": 1, "maxItems": MAX_STEPS,
    "items": {
        "type": "object", "required": ["provider", "endpoint"],
        "properties": {
            "provider": {"type": "string", "description": "workers-ai or a configured one"},
            "endpoint": {"type": "string", "description": "the provider-relative path"},
            "query": {"description": "the body sent upstream"},
            "headers": {"type": ["object", "null"],
                        "additionalProperties": {"type": ["string", "number", "boolean"]}},
            "config": {"type": ["object", "null"],
                       "description": "retries: maxAttempts, retryDelay, backoff, "
                                      "requestTimeout"},
        },
    },
}
