"""Every error a client can be answered with: the one table of codes and HTTP statuses.

Each class states its Cloudflare code and HTTP status once, in its class line; a variant that
differs only in status, message or meaning subclasses the class that owns the code, so a code
has one definition (tests/test_contract.py holds the table to that). The HTTP layers
(edgefire.contract.http_errors) render any of these as a Cloudflare v4 envelope or an OpenAI
error; any other exception is an internal error.
"""

from __future__ import annotations


class EdgefireError(Exception):
    """Base for errors caused by a request, carrying the API code and HTTP status to report."""

    code: int = 5000
    status: int = 500
    default_message: str = "Internal server error"

    def __init_subclass__(cls, *, code: int | None = None, status: int | None = None,
                          message: str | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = code
        if status is not None:
            cls.status = status
        if message is not None:
            cls.default_message = message

    def __init__(self, message: str | None = None, *, field: str | None = None) -> None:
        message = self.default_message if message is None else message
        super().__init__(message)
        self.message = message
        self.field = field


# 1xxx: accounts, gateways and their objects. 1003 and 1004 are AI Gateway's "already exists"
# and "not found" codes for custom providers (reference §5.10), used for every object here.
class ConflictError(EdgefireError, code=1003, status=409):
    """The object already exists under that id."""


class NotFoundError(EdgefireError, code=1004, status=404):
    """The account, token, gateway or log does not exist (or belongs to another account)."""


# 2xxx: the gateway's rate limit (AI Gateway documents the 429, not a code).
class RateLimitedError(EdgefireError, code=2003, status=429):
    """The gateway's rate limit is reached."""


class RateLimitUnavailableError(RateLimitedError, status=503):
    """Rate limits fail closed and their store (Redis) cannot be reached: the caller exceeded
    nothing and may retry, hence 503."""


# 3xxx: Workers AI's request and capacity errors.
class InternalError(EdgefireError, code=3001):
    """Anything unexpected; the details stay in the log."""


class RequestTooLargeError(EdgefireError, code=3006, status=413,
                           message="Request is too large"):
    """The body is over the size limit, declared or found while reading."""


class RequestTimeoutError(EdgefireError, code=3007, status=408, message="Request timeout"):
    """The request ran past its time limit and was cancelled."""


class ClientGoneError(EdgefireError, code=3008, status=499,
                      message="Client closed the request"):
    """The client closed the connection first; nobody reads the answer (nginx's 499)."""


class CapacityError(EdgefireError, code=3040, status=429,
                    message="Capacity temporarily exceeded, please try again."):
    """No capacity for this request now: a busy node, or no room to load the model."""


class NoNodeError(CapacityError, message="No more data centers to forward the request to"):
    """The gateway has no node that can take the model."""


class FleetStartingError(NoNodeError, status=503, message=(
        "The edge fleet is starting: no node is ready yet; retry in a few seconds")):
    """No node has become ready since the gateway started (edge-gateway dev's start-up)."""


class UpstreamError(CapacityError):
    """The upstream could not be reached or answered in time (retried, then falls back)."""


class EngineFailedError(EdgefireError, code=3043):
    """The engine failed on this request: its step raised, or the engine stopped. What went
    wrong is in the node's log; exception text can show paths, shapes or other tenants' state."""


# 5xxx: inputs, models and weights.
class InvalidInputError(EdgefireError, code=5006, status=400):
    """A request field is missing, of the wrong type or out of range."""


class ContextLengthError(InvalidInputError, code=3010):
    """The prompt (plus requested tokens) does not fit the model's context window: Workers AI's
    3010, and still an invalid input to whoever catches those."""


class ConfigError(InvalidInputError, status=500):
    """The gateway's own configuration cannot be used: it refuses to start."""


class UnknownModelError(EdgefireError, code=5007, status=400):
    """The model id is not in the catalog."""


class ModelUnavailableError(EdgefireError, code=5018, status=400):
    """The model is in the catalog but cannot run on this machine."""


class UnknownComponentError(ModelUnavailableError):
    """Config names a model architecture, KV backend, codec, … that no plugin registered."""


class NoHostError(ModelUnavailableError):
    """No city of the fleet declares accelerators the capacity planner says can host the
    model (edgefire.planning): permanent for this fleet, so a 400, never a 429."""


class HostsOfflineError(NoHostError, status=503):
    """Cities that can host the model exist, but none of them is live now: a retry later may
    find one, hence 503."""


class PlanningError(InvalidInputError):
    """The capacity planner cannot plan what it was asked: an unknown accelerator, GPU set,
    layout, codec or KV dtype, or a model config it has no formula for (edgefire.planning)."""


class ReplayMissError(EdgefireError, code=5090, status=404,
                      message="No recording matches this request"):
    """The gateway replays recordings (EDGEFIRE_REPLAY_DIR) and has none for this request, or
    has answered each recorded occurrence already. 404 rather than 5xx: retrying cannot help,
    and clients such as the OpenAI SDK retry 5xx answers."""


class WeightsNotFoundError(EdgefireError, code=5019):
    """A weights source cannot be resolved (for example its package is not installed)."""


class CorruptWeightsError(EdgefireError, code=5020):
    """A weights file is damaged or is not in the format it claims to be."""


# 7xxx and 10000: routing and authentication.
class RouteError(EdgefireError, code=7000, status=404):
    """No route for the URI (7000, 404) or not for this method (7001, 405), as Cloudflare says."""

    def __init__(self, status: int) -> None:
        if status == 405:
            self.code, self.status = 7001, 405
        super().__init__("Method not allowed" if status == 405 else "No route for that URI")


class AuthenticationError(EdgefireError, code=10000, status=401,
                          message="Authentication error"):
    """No credentials, or credentials that are unknown or revoked."""


class ForbiddenError(AuthenticationError, status=403):
    """The credentials are valid but do not grant access to what was asked for."""
