"""Accounts and their API tokens; only a hash of each token is ever stored."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import sqlite3
import time
from dataclasses import dataclass

from edgefire.contract.errors import ConflictError, InvalidInputError, NotFoundError
from edgefire.gateway.db import Database

TOKEN_PREFIX = "ef_"
_ACCOUNT_ID = re.compile(r"[0-9a-f]{32}")
_MAX_NAME = 100


@dataclass(slots=True)
class Account:
    id: str
    name: str
    created_at: float


@dataclass(slots=True)
class TokenInfo:
    id: str
    account_id: str
    name: str
    created_at: float
    revoked_at: float | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


def hash_token(token: str) -> str:
    # Tokens are 240 bits of randomness, so nobody can brute-force one from its hash and a slow
    # password hash (bcrypt, scrypt) would buy nothing but latency on every request.
    return hashlib.sha256(token.encode()).hexdigest()


def _check_name(name: object, field: str) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > _MAX_NAME:
        raise InvalidInputError(f"{field} must be a non-empty string of at most {_MAX_NAME} "
                                "characters", field=field)
    return name


def _account(row: sqlite3.Row) -> Account:
    return Account(id=row["id"], name=row["name"], created_at=row["created_at"])


def _token(row: sqlite3.Row) -> TokenInfo:
    return TokenInfo(id=row["id"], account_id=row["account_id"], name=row["name"],
                     created_at=row["created_at"], revoked_at=row["revoked_at"])


class AccountStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def create_account(self, name: str, account_id: str | None = None) -> Account:
        """A new account; `account_id` lets a user reuse the id their clients already send."""
        _check_name(name, "name")
        if account_id is None:
            account_id = secrets.token_hex(16)
        elif not isinstance(account_id, str) or not _ACCOUNT_ID.fullmatch(account_id):
            raise InvalidInputError("an account id is 32 lowercase hex characters",
                                    field="account_id")
        account = Account(id=account_id, name=name, created_at=time.time())
        try:
            self.db.execute("INSERT INTO accounts (id, name, created_at) VALUES (?, ?, ?)",
                            (account.id, account.name, account.created_at))
        except sqlite3.IntegrityError:
            raise ConflictError(f"account {account_id} already exists",
                                field="account_id") from None
        return account

    def get_account(self, account_id: str) -> Account | None:
        rows = self.db.query("SELECT * FROM accounts WHERE id = ?", (account_id,))
        return _account(rows[0]) if rows else None

    def list_accounts(self) -> list[Account]:
        return [_account(row) for row in
                self.db.query("SELECT * FROM accounts ORDER BY created_at, id")]

    def create_token(self, account_id: str, name: str = "default") -> tuple[TokenInfo, str]:
        """A new token for the account, with its plaintext: the only time it is available."""
        _check_name(name, "name")
        if self.get_account(account_id) is None:
            raise NotFoundError(f"no account {account_id}", field="account_id")
        token = TOKEN_PREFIX + secrets.token_urlsafe(30)  # 30 bytes -> 40 url-safe characters
        info = TokenInfo(id=secrets.token_hex(16), account_id=account_id, name=name,
                         created_at=time.time(), revoked_at=None)
        self.db.execute(
            "INSERT INTO tokens (id, account_id, name, token_hash, created_at, revoked_at)"
            " VALUES (?, ?, ?, ?, ?, NULL)",
            (info.id, info.account_id, info.name, hash_token(token), info.created_at))
        return info, token

    def revoke_token(self, token_id: str) -> bool:
        """Revoke an active token; False if there is no such token or it was already revoked."""
        changed = self.db.execute(
            "UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
            (time.time(), token_id))
        return changed > 0

    def authenticate(self, token: str) -> str | None:
        """The account id of a valid, unrevoked token, else None."""
        if not token.startswith(TOKEN_PREFIX):
            return None
        digest = hash_token(token)
        rows = self.db.query(
            "SELECT account_id, token_hash FROM tokens WHERE token_hash = ? AND revoked_at IS NULL",
            (digest,))
        # The indexed lookup already matched; the constant-time comparison keeps the final
        # accept/reject decision free of a timing signal should the lookup ever change.
        if rows and hmac.compare_digest(rows[0]["token_hash"], digest):
            return rows[0]["account_id"]
        return None

    def list_tokens(self, account_id: str) -> list[TokenInfo]:
        rows = self.db.query(
            "SELECT id, account_id, name, created_at, revoked_at FROM tokens"
            " WHERE account_id = ? ORDER BY created_at, id", (account_id,))
        return [_token(row) for row in rows]
