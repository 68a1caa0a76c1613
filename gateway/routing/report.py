"""A node's heartbeat payload, validated field by field before the directory trusts it.

Even a node with a valid credential gets nothing unchecked: its URL is where every tenant's
prompts will go, so it must be a plain http(s) origin, and its sizes are bounded so that one
report cannot grow the gateway's memory.
"""

from __future__ import annotations

import ipaddress
import math
import re
from urllib.parse import urlsplit

from runtime.errors import InvalidInputError

STATUSES = ("ok", "degraded", "starting")
ROLES = ("prefill", "decode", "both")
MAX_URL_CHARS = 2048
MAX_MODEL_ID_CHARS = 256
_CITY = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NAME_CHARS = 128
_HOST = re.compile(r"[A-Za-z0-9.-]{1,253}")


def validate(payload: object, max_models: int) -> dict:
    """The fields of a NodeState from a heartbeat; InvalidInputError (5006) naming the field."""
    if not isinstance(payload, dict):
        raise InvalidInputError("a heartbeat is a JSON object")
    city = _string(payload, "city")
    if not _CITY.fullmatch(city):
        raise InvalidInputError("city must be 1-64 letters, digits, '-' or '_'", field="city")
    name = payload.get("name") or ""
    if not isinstance(name, str) or len(name) > _NAME_CHARS:
        raise InvalidInputError(f"name must be a string of at most {_NAME_CHARS} characters",
                                field="name")
    return {
        "city": city,
        "url": node_url(_string(payload, "url")),
        "lat": _number(payload, "lat", -90, 90),
        "lon": _number(payload, "lon", -180, 180),
        "memory_budget_bytes": _count(payload, "memory_budget_bytes"),
        "accelerator_bytes": _count(payload, "accelerator_bytes"),
        "loaded_models": _models(payload.get("loaded_models", {}), max_models),
        "running": _count(payload, "running", 0),
        "waiting": _count(payload, "waiting", 0),
        "kv_usage": _number(payload, "kv_usage", 0, 1, 0.0),
        "name": name,
        "role": _choice(payload, "role", ROLES, "both"),
        "status": _choice(payload, "status", STATUSES, "ok"),
    }


def node_url(url: str) -> str:
    """url as an origin (`http[s]://host[:port]`, no trailing slash), or InvalidInputError.

    No path either: the gateway appends its own API paths to it, and a node behind a proxy is
    reached at the proxy's origin.
    """
    def bad(why: str) -> InvalidInputError:
        return InvalidInputError(f"url {why}", field="url")

    if len(url) > MAX_URL_CHARS or any(c.isspace() or not c.isprintable() for c in url):
        raise bad(f"must be at most {MAX_URL_CHARS} printable characters without spaces")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise bad("must start with http:// or https://")
    if "@" in parts.netloc:
        raise bad("must not carry a user name or password")
    if "?" in url or "#" in url:
        raise bad("must not have a query string or fragment")
    if parts.path not in ("", "/"):
        raise bad("must be an origin (scheme, host and port) without a path")
    if not parts.hostname or not _host_ok(parts.hostname):
        raise bad("must name a host (a DNS name or an IP address)")
    try:
        port = parts.port  # ValueError when it is not a number in [0, 65535]
    except ValueError:
        port = 0
    if port == 0:
        raise bad("has a port out of range (1-65535)")
    return f"{parts.scheme}://{parts.netloc}"


def _host_ok(host: str) -> bool:
    if _HOST.fullmatch(host):
        return True
    try:
        return ipaddress.ip_address(host).version == 6  # urlsplit drops the brackets
    except ValueError:
        return False


def _models(value: object, max_models: int) -> dict[str, dict]:
    if not (isinstance(value, dict)
            and all(isinstance(k, str) and isinstance(v, dict) for k, v in value.items())):
        raise InvalidInputError("loaded_models maps model ids to objects", field="loaded_models")
    if len(value) > max_models:
        raise InvalidInputError(f"loaded_models has more than {max_models} entries",
                                field="loaded_models")
    if any(len(k) > MAX_MODEL_ID_CHARS for k in value):
        raise InvalidInputError(f"model ids are at most {MAX_MODEL_ID_CHARS} characters",
                                field="loaded_models")
    return value


_REQUIRED = object()


def _string(payload: dict, name: str) -> str:
    value = payload.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{name} must be a non-empty string", field=name)
    return value


def _choice(payload: dict, name: str, allowed: tuple[str, ...], default: str) -> str:
    value = payload.get(name)
    if value is None:
        return default
    if value not in allowed:
        raise InvalidInputError(f"{name} must be one of {', '.join(allowed)}", field=name)
    return value


def _count(payload: dict, name: str, default: object = _REQUIRED) -> int:
    value = payload.get(name, default)
    if value is _REQUIRED:
        raise InvalidInputError(f"{name} is required", field=name)
    # bool is an int subclass; a true "memory budget" is a sender bug, not a count.
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidInputError(f"{name} must be a non-negative integer", field=name)
    return value


def _number(payload: dict, name: str, low: float, high: float,
            default: object = _REQUIRED) -> float:
    value = payload.get(name, default)
    if value is _REQUIRED:
        raise InvalidInputError(f"{name} is required", field=name)
    if (not isinstance(value, int | float) or isinstance(value, bool)
            or not math.isfinite(value) or not low <= value <= high):
        raise InvalidInputError(f"{name} must be a number in [{low}, {high}]", field=name)
    return float(value)
