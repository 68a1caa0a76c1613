"""Who may report as an edge node: the fleet secret and per-node secrets.

A credential is named by an id, never by its secret: "fleet" for EDGEFIRE_NODE_SECRET, and
"node:<city>" for a city's own secret from gateway.yaml (`nodes: {fra: {secret_env: VAR}}`).
The directory binds each city to the id that registered it; the gateway sends that same
credential's secret when it calls the city's node, which checks it as its EDGEFIRE_NODE_SECRET.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from edgefire.contract.errors import AuthenticationError, ConfigError, ForbiddenError

FLEET = "fleet"
OPEN = "open"  # no credentials configured: only reachable by building the state in code


@dataclass(slots=True, frozen=True)
class NodeCredentials:
    fleet: str | None = None
    per_city: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, fleet: str | None, nodes: object,
             environ: Mapping[str, str] = os.environ) -> NodeCredentials:
        """From EDGEFIRE_NODE_SECRET and gateway.yaml's `nodes` section; ConfigError if bad."""
        if not isinstance(nodes, dict):
            raise ConfigError("gateway.yaml: nodes must map city codes to {secret_env: VAR}")
        per_city = {}
        for city, section in nodes.items():
            env = section.get("secret_env") if isinstance(section, dict) else None
            if not isinstance(env, str) or not env:
                raise ConfigError(f"gateway.yaml: nodes.{city} needs secret_env (a variable name)")
            secret = environ.get(env)
            if not secret:
                raise ConfigError(f"gateway.yaml: nodes.{city}.secret_env names {env}, "
                                  "which is not set")
            per_city[str(city)] = secret
        return cls(fleet or None, per_city)

    @property
    def configured(self) -> bool:
        return bool(self.fleet or self.per_city)

    def authenticate(self, sent: str) -> list[str]:
        """The ids of the credentials `sent` is (AuthenticationError, 401, if none).

        Every secret is compared, in constant time, so timing does not tell which was close.
        """
        if not self.configured:
            return [OPEN]
        matches = [cid for cid, secret in self._all() if _same(sent, secret)]
        if not matches:
            raise AuthenticationError("Authentication error")
        return matches

    def for_city(self, city: str, matches: list[str]) -> str:
        """Which of `matches` reports as `city`: its own credential when it has one (else
        ForbiddenError, 403), any valid one otherwise (the directory then binds the city)."""
        own = f"node:{city}"
        if own in matches:
            return own
        if city in self.per_city:
            raise ForbiddenError(f"city {city!r} has its own node credential; this is another")
        return matches[0]

    def secret(self, credential: str) -> str | None:
        """The secret to send to a node bound to `credential` (None for an open gateway)."""
        if credential == FLEET:
            return self.fleet
        return self.per_city.get(credential.removeprefix("node:"))

    def _all(self) -> list[tuple[str, str]]:
        pairs = [(f"node:{city}", secret) for city, secret in self.per_city.items()]
        return pairs + ([(FLEET, self.fleet)] if self.fleet else [])


def _same(sent: str, secret: str) -> bool:
    return hmac.compare_digest(sent.encode(), secret.encode())


def require_configured(credentials: NodeCredentials) -> None:
    """`edge-gateway start` refuses to run open: anyone could register a node and take traffic."""
    if not credentials.configured:
        raise ConfigError("no node credentials: set EDGEFIRE_NODE_SECRET or gateway.yaml "
                          "nodes: {city: {secret_env: VAR}} (edge-gateway dev makes its own)")
