"""AI Gateway objects (reference §5.12): per-account settings for caching, logs and rate limits."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import asdict, dataclass
from typing import Literal

from edgefire.contract.errors import ConflictError, InvalidInputError, NotFoundError
from edgefire.contract.validation import Checker
from edgefire.gateway.db import Database, iso_time
from edgefire.gateway.schemas import GATEWAY_CREATE, GATEWAY_SETTINGS

DEFAULT_GATEWAY = "default"
MAX_GATEWAYS_PER_ACCOUNT = 10
_BOOLS = ("cache_invalidate_on_update", "collect_logs", "authentication")
_SETTINGS = (*_BOOLS, "cache_ttl", "rate_limiting_limit", "rate_limiting_interval",
             "rate_limiting_technique")
_CREATE, _UPDATE = Checker(GATEWAY_CREATE), Checker(GATEWAY_SETTINGS)


@dataclass(slots=True)
class GatewayConfig:
    id: str
    account_id: str
    cache_ttl: int | None = None
    cache_invalidate_on_update: bool = False
    collect_logs: bool = True
    rate_limiting_limit: int | None = None
    rate_limiting_interval: int | None = None
    rate_limiting_technique: Literal["fixed", "sliding"] = "fixed"
    authentication: bool = False
    created_at: float = 0.0
    modified_at: float = 0.0

    @property
    def cache_enabled(self) -> bool:
        return bool(self.cache_ttl)

    @property
    def rate_limit_enabled(self) -> bool:
        return bool(self.rate_limiting_limit) and bool(self.rate_limiting_interval)

    def to_json(self) -> dict:
        body = {name: getattr(self, name) for name in ("id", *_SETTINGS)}
        body["created_at"] = iso_time(self.created_at)
        body["modified_at"] = iso_time(self.modified_at)
        return body


def _validated(config: GatewayConfig, fields: dict) -> GatewayConfig:
    """`config` with `fields` (checked by the schema) applied, or InvalidInputError naming the
    first field at fault."""
    if fields.get("id", config.id) != config.id:
        raise InvalidInputError("a gateway's id cannot be changed", field="id")
    for name in _SETTINGS:
        if name in fields:
            value = fields[name]
            # JSON Schema counts 60.0 as an integer; the store keeps ints.
            setattr(config, name, int(value) if isinstance(value, float) else value)
    # A limit without a window (or the reverse) cannot be enforced; say so rather than ignore it.
    if bool(config.rate_limiting_limit) != bool(config.rate_limiting_interval):
        missing = "rate_limiting_interval" if config.rate_limiting_limit else "rate_limiting_limit"
        raise InvalidInputError(f"rate limiting needs both a limit and an interval; {missing} "
                                "is not set", field=missing)
    return config


def _gateway(row: sqlite3.Row) -> GatewayConfig:
    config = GatewayConfig(**dict(row))
    for name in _BOOLS:
        setattr(config, name, bool(getattr(config, name)))
    return config


class GatewayStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def create(self, account_id: str, fields: dict) -> GatewayConfig:
        gateway_id = _CREATE.check(fields)["id"]
        now = time.time()
        config = _validated(GatewayConfig(id=gateway_id, account_id=account_id, created_at=now,
                                          modified_at=now), fields)
        with self.db.transaction():
            count = self.db.query("SELECT COUNT(*) FROM gateways WHERE account_id = ?",
                                  (account_id,))[0][0]
            if count >= MAX_GATEWAYS_PER_ACCOUNT:
                raise InvalidInputError(f"an account can have at most {MAX_GATEWAYS_PER_ACCOUNT}"
                                        " gateways", field="id")
            self._insert(config)
        return config

    def get(self, account_id: str, gateway_id: str) -> GatewayConfig | None:
        rows = self.db.query("SELECT * FROM gateways WHERE account_id = ? AND id = ?",
                             (account_id, gateway_id))
        return _gateway(rows[0]) if rows else None

    def get_or_create_default(self, account_id: str) -> GatewayConfig:
        """The account's `default` gateway, created on first use as AI Gateway does (§5.1)."""
        with self.db.transaction():
            existing = self.get(account_id, DEFAULT_GATEWAY)
            if existing is not None:
                return existing
            now = time.time()
            config = GatewayConfig(id=DEFAULT_GATEWAY, account_id=account_id, created_at=now,
                                   modified_at=now)
            # Auto-creation skips the per-account limit: a request naming `default` must not
            # fail because the user made ten gateways of their own.
            self._insert(config)
        return config

    def list(self, account_id: str) -> list[GatewayConfig]:
        rows = self.db.query("SELECT * FROM gateways WHERE account_id = ? ORDER BY created_at, id",
                             (account_id,))
        return [_gateway(row) for row in rows]

    def update(self, account_id: str, gateway_id: str, fields: dict) -> GatewayConfig:
        """Replace the given settings, keep the rest; NotFoundError if there is no such gateway."""
        with self.db.transaction():
            current = self.get(account_id, gateway_id)
            if current is None:
                raise NotFoundError(f"no gateway {gateway_id!r}", field="id")
            config = _validated(current, _UPDATE.check(fields))
            config.modified_at = time.time()
            assignments = ", ".join(f"{name} = ?" for name in (*_SETTINGS, "modified_at"))
            values = [getattr(config, name) for name in (*_SETTINGS, "modified_at")]
            self.db.execute(f"UPDATE gateways SET {assignments} WHERE account_id = ? AND id = ?",
                            (*values, account_id, gateway_id))
        return config

    def delete(self, account_id: str, gateway_id: str) -> bool:
        """Delete the gateway and (by foreign-key cascade) its logs; False if there was none."""
        return self.db.execute("DELETE FROM gateways WHERE account_id = ? AND id = ?",
                               (account_id, gateway_id)) > 0

    def _insert(self, config: GatewayConfig) -> None:
        row = asdict(config)
        columns = ", ".join(row)
        try:
            self.db.execute(f"INSERT INTO gateways ({columns}) VALUES "
                            f"({', '.join('?' * len(row))})", tuple(row.values()))
        except sqlite3.IntegrityError as exc:
            if "FOREIGN KEY" in str(exc):
                raise NotFoundError(f"no account {config.account_id}",
                                    field="account_id") from None
            raise ConflictError(f"a gateway named {config.id!r} already exists",
                                field="id") from None
