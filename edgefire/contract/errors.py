"""Every error a client can be answered with: the one table of codes and HTTP statuses.

Each class names its Cloudflare code and status once; a variant that differs only in status or
meaning subclasses the class that owns the code, so a code has a single definition (a test
holds the table to that). The HTTP layers (edgefire.contract.http_errors) render any of these
as a Cloudflare v4 envelope or an OpenAI error; anything else is an internal error.
"""

from __future__ import annotations


class EdgefireError(Exception):
    """Base for errors caused by a request, carrying the API code and HTTP status to report."""

    code: int = 5000
    status: int = 500
    default_message: str = "Internal server error"

    def __init__(self, message: str | None = None, *, field: str | None = None) -> None:
        message = self.default_message if message is None else message
        super().__init__(message)
        self.message = message
        self.field = field


# --- 1xxx: accounts, gateways and their objects -------------------------------------------

class ConflictError(EdgefireError):
    """The object already exists under that id."""

    # 1003 is AI Gateway's "already exists" code for custom providers (reference §5.10).
    code = 1003
    status = 409


class NotFoundError(EdgefireError):
    """The account, token, gateway or log does not exist (or belongs to another account)."""

    # 1004 is what AI Gateway answers for a missing custom provider (reference §5.10).
    code = 1004
    status = 404


# --- 2xxx: the gateway's rate limit ----------------------------------------------------------

class RateLimitedError(EdgefireError):
    """The gateway's rate limit is reached (AI Gateway documents the 429, not a code)."""

    code = 2003
    status = 429


class RateLimitUnavailableError(RateLimitedError):
    """Rate limits are failing closed and their store (Redis) cannot be reached.

    503, not 429: the caller did not exceed anything and may retry; the code is the rate
    limit's, which this is about.
    """

    status = 503


# --- 3xxx: Workers AI's request and capacity errors ------------------------------------------

class InternalError(EdgefireError):
    code = 3001
    status = 500


class RequestTooLargeError(EdgefireError):
    code = 3006
    status = 413
    default_message = "Request is too large"


class RequestTimeoutError(EdgefireError):
    code = 3007
    status = 408
    default_message = "Request timeout"


class ClientGoneError(EdgefireError):
    """The client closed the connection first; nobody reads the answer (nginx's 499)."""

    code = 3008
    status = 499
    default_message = "Client closed the request"


class CapacityError(EdgefireError):
    """No capacity for this request now: a busy node, no room to load the model, no node."""

    code = 3040
    status = 429
    default_message = "Capacity temporarily exceeded, please try again."


class NoNodeError(CapacityError):
    """The gateway has no node that can take the model."""

    default_message = "No more data centers to forward the request to"


class FleetStartingError(NoNodeError):
    """No node has become ready since the gateway started (edge-gateway dev's start-up)."""

    status = 503
    default_message = ("The edge fleet is starting: no node is ready yet; retry in a few "
                       "seconds")


class UpstreamError(CapacityError):
    """The upstream could not be reached or answered in time (retried, then falls back)."""


class EngineFailedError(EdgefireError):
    """The engine failed on this request: its step raised, or the engine stopped.

    What went wrong is logged on the node with its traceback; clients only learn that it
    was internal (exception text can show paths, shapes or other tenants' state).
    """

    code = 3043
    status = 500


# --- 5xxx: inputs and models -----------------------------------------------------------------

class InvalidInputError(EdgefireError):
    """A request field is missing, of the wrong type or out of range."""

    code = 5006
    status = 400


class ContextLengthError(InvalidInputError):
    """The prompt (plus requested tokens) does not fit the model's context window."""

    code = 3010


class ConfigError(InvalidInputError):
    """The gateway's own configuration cannot be used: it refuses to start."""

    status = 500


class UnknownModelError(EdgefireError):
    """The model id is not in the catalog."""

    code = 5007
    status = 400


class ModelUnavailableError(EdgefireError):
    """The model is in the catalog but cannot run on this machine."""

    code = 5018
    status = 400


class UnknownComponentError(ModelUnavailableError):
    """Config names a model architecture, KV backend, codec, … that no plugin registered."""


class WeightsNotFoundError(EdgefireError):
    """A weights source cannot be resolved (for example its package is not installed)."""

    code = 5019
    status = 500


class CorruptWeightsError(EdgefireError):
    """A weights file is damaged or is not in the format it claims to be."""

    code = 5020
    status = 500


# --- 7xxx, 10000: routing and authentication ---------------------------------------------------

class RouteError(EdgefireError):
    """No route for the URI (7000, 404) or not for this method (7001, 405), as Cloudflare says."""

    code = 7000
    status = 404

    def __init__(self, status: int) -> None:
        if status == 405:
            self.status, self.code = 405, 7001
        super().__init__("Method not allowed" if status == 405 else "No route for that URI")


class AuthenticationError(EdgefireError):
    """No credentials, or credentials that are unknown or revoked."""

    code = 10000
    status = 401
    default_message = "Authentication error"


class ForbiddenError(AuthenticationError):
    """The credentials are valid but do not grant access to what was asked for."""

    status = 403
