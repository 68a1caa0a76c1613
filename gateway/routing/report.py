"""A node's heartbeat payload, validated field by field before the directory trusts it.

Even a node with a valid credential gets nothing unchecked: its URL is where every tenant's
prompts will go, so it must be a plain http(s) origin, and its sizes are bounded so that one
report cannot grow the gateway's memory.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from edgefire.contract.errors import InvalidInputError
from edgefire.contract.node_report import NodeReport
from edgefire.contract.schemas import HEARTBEAT

MAX_URL_CHARS = HEARTBEAT["properties"]["url"]["maxLength"]
_HOST = re.compile(r"[A-Za-z0-9.-]{1,253}")


def validate(payload: object, max_models: int) -> NodeReport:
    """A heartbeat's report: the HEARTBEAT schema (NodeReport.from_json), then what a schema
    cannot say (an origin URL, the configured model count); InvalidInputError (5006) naming
    the field."""
    report = NodeReport.from_json(payload)
    if len(report.loaded_models) > max_models:
        raise InvalidInputError(f"loaded_models has more than {max_models} entries",
                                field="loaded_models")
    report.url = node_url(report.url)
    return report


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
