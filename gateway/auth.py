"""Who is calling: an account API token, as `Authorization: Bearer` (or `cf-aig-authorization`)."""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from edgefire.contract.errors import AuthenticationError, ForbiddenError
from edgefire.gateway.accounts import AccountStore
from edgefire.gateway.gateways import GatewayConfig

_AIG_AUTH = "cf-aig-authorization"


def bearer(value: str | None) -> str | None:
    if value and value[:7].lower() == "bearer ":
        return value[7:].strip() or None
    return None


class Authenticator:
    def __init__(self, accounts: AccountStore) -> None:
        self.accounts = accounts

    def check(self, headers: Mapping[str, str], account_id: str,
              gateway: GatewayConfig | None = None) -> None:
        """Raise 401 without a valid token, 403 when it belongs to another account.

        A gateway with `authentication` on takes its token from cf-aig-authorization only, as
        AI Gateway does; elsewhere either header may carry it.
        """
        tokens = [bearer(headers.get(_AIG_AUTH))]
        if gateway is None or not gateway.authentication:
            tokens.append(bearer(headers.get("authorization")))
        owners = {self.accounts.authenticate(t) for t in tokens if t}
        owners.discard(None)
        if not owners:
            raise AuthenticationError("Authentication error")
        if account_id not in owners:
            raise ForbiddenError("Authentication error: the token does not grant access to "
                                 "this account")


def check_admin(headers: Mapping[str, str], admin_token: str | None, what: str) -> None:
    """401 unless the request carries the operator's admin token (none set: always 401)."""
    sent = bearer(headers.get("authorization")) or ""
    if not admin_token or not hmac.compare_digest(sent.encode(), admin_token.encode()):
        raise AuthenticationError(f"Authentication error: {what} needs the admin token "
                                  "(EDGEFIRE_ADMIN_TOKEN) as Authorization: Bearer")
