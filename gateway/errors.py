"""Typed gateway errors: each maps to a Cloudflare v4 error envelope with its code and status."""

from __future__ import annotations

from edgefire.runtime.errors import EdgefireError


class NotFoundError(EdgefireError):
    """The account, token, gateway or log does not exist (or belongs to another account)."""

    # 1004 is what AI Gateway answers for a missing custom provider (reference §5.10).
    code = 1004
    status = 404


class ConflictError(EdgefireError):
    """The object already exists under that id."""

    # 1003 is AI Gateway's "already exists" code for custom providers (reference §5.10).
    code = 1003
    status = 409


class AuthError(EdgefireError):
    """The request carries no credentials, or credentials that are unknown or revoked."""

    code = 10000
    status = 401


class ForbiddenError(AuthError):
    """The credentials are valid but do not grant access to what was asked for."""

    status = 403


class ConfigError(EdgefireError):
    """The gateway's own configuration cannot be used: it refuses to start."""

    code = 5006
    status = 500
