"""What a Worker's env.AI request is and who makes it, read from the raw ASGI scope: shared by
its routes (edgefire.gateway.routes_binding) and record/replay (edgefire.gateway.recording),
which must see the same call (unwrapped from Miniflare's form) and apply the same rule to it.

Miniflare's `remoteProxyConnectionString` sends each call to the gateway (`/` or any binding
path) with the binding's own URL in `MF-URL` and each header renamed `MF-Header-<name>`; a
wrangler dev plugin sends the call as it is.

Authentication: a call with `Authorization: Bearer <token>` runs as the token's account.
Without one, it is served as `binding_account` (edge-gateway dev sets its dev account) if the
call comes from loopback and its outer Host is loopback or the binding's `workers-binding.ai`:
a browser page on a DNS name rebound to 127.0.0.1 sends neither. Else 10000 (401).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.datastructures import Headers, QueryParams
from starlette.types import Scope

from edgefire.contract.errors import AuthenticationError
from edgefire.gateway.accounts import AccountStore
from edgefire.gateway.auth import bearer

# The paths a call may arrive at: the binding's own, and `/` for Miniflare's wrapped form.
BINDING_PATHS = ("/", "/run", "/ai-gateway/run", "/ai-api/models/search",
                 "/ai-gateway/gateways/{gateway_id}/logs/{log_id}")
# The binding paths that run a model; models search and getLog only read.
INFERENCE_PATHS = ("/run", "/ai-gateway/run")
BINDING_HOST = "workers-binding.ai"  # the host of every URL the binding fetches
MF_URL, _MF_HEADER = "mf-url", "mf-header-"
_LOCAL_HOSTS = frozenset({"127.0.0.1", "::1", "localhost", BINDING_HOST})
# BINDING_PATHS as the router matches them ({name}: one path segment).
_ROUTED = re.compile("|".join(re.sub(r"\{\w+\}", "[^/]+", path) for path in BINDING_PATHS))


@dataclass(frozen=True, slots=True)
class BindingCall:
    """One env.AI request as the binding made it, unwrapped from Miniflare's form if need be."""

    method: str
    path: str
    query: QueryParams
    headers: dict[str, str]  # lower-case names

    @classmethod
    def of(cls, scope: Scope) -> BindingCall:
        outer = dict(Headers(scope=scope))
        target = outer.get(MF_URL)
        if target is None:
            return cls(scope["method"], scope["path"], QueryParams(scope["query_string"]), outer)
        url = urlsplit(target)
        # A header the proxy renamed wins over the outer request's own (its length, its host).
        headers = {name: value for name, value in outer.items() if not name.startswith("mf-")}
        headers |= {name[len(_MF_HEADER):]: value for name, value in outer.items()
                    if name.startswith(_MF_HEADER)}
        return cls(scope["method"], url.path or "/", QueryParams(url.query), headers)


def binding_inference(scope: Scope) -> BindingCall | None:
    """The unwrapped call if this request is an env.AI run() (either form), else None."""
    if scope["type"] != "http" or scope["method"] != "POST" or not _ROUTED.fullmatch(
            scope["path"]):
        return None
    call = BindingCall.of(scope)
    return call if call.path in INFERENCE_PATHS else None


def binding_account(scope: Scope, call: BindingCall, accounts: AccountStore,
                    fallback: str | None) -> str:
    """The account a call runs as (see the module docstring); `fallback` is
    settings.binding_account, read per call as tests and dev may set it late."""
    token = bearer(call.headers.get("authorization"))
    if token is not None:
        account_id = accounts.authenticate(token)
        if account_id is None:
            raise AuthenticationError()
        return account_id
    if fallback and from_this_machine(scope):
        return fallback
    raise AuthenticationError(
        "Authentication error: env.AI calls need an account token (Authorization: Bearer, "
        "which the wrangler plugin sends when given one); only `edge-gateway dev` serves "
        "them without one, from this machine")


def from_this_machine(scope: Scope) -> bool:
    """Loopback peer, and the outer Host is loopback or the binding's (never MF-Header-host:
    a page could set that one)."""
    client = scope.get("client")
    try:
        peer = ipaddress.ip_address(client[0] if client else "")
    except ValueError:
        return False
    host = urlsplit("//" + Headers(scope=scope).get("host", "")).hostname
    return peer.is_loopback and host in _LOCAL_HOSTS
