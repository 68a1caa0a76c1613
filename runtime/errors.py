"""Typed user-facing errors; the HTTP layer maps each to a Workers AI error envelope."""

from __future__ import annotations


class EdgefireError(Exception):
    """Base for errors caused by a request, carrying the API code and HTTP status to report."""

    code: int = 5000
    status: int = 500

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidInputError(EdgefireError):
    """A request field is missing, of the wrong type or out of range."""

    code = 5006
    status = 400


class ContextLengthError(InvalidInputError):
    """The prompt (plus requested tokens) does not fit the model's context window."""

    code = 3010


class UnknownModelError(EdgefireError):
    """The model id is not in the catalog."""

    code = 5007
    status = 400


class ModelUnavailableError(EdgefireError):
    """The model is in the catalog but cannot run on this machine."""

    code = 5018
    status = 400


class WeightsNotFoundError(EdgefireError):
    """A weights source cannot be resolved (for example its package is not installed)."""

    code = 5019
    status = 500


class CorruptWeightsError(EdgefireError):
    """A weights file is damaged or is not in the format it claims to be."""

    code = 5020
    status = 500
