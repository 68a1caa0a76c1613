"""What the binding raises, named as workerd names them so Worker code ports over unchanged."""

from __future__ import annotations

import httpx


class BindingError(Exception):
    """An error answer: `code` is Cloudflare's internal code, `status` the HTTP status."""

    def __init__(self, message: str, *, code: int | None = None,
                 status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status

    @classmethod
    def from_response(cls, response: httpx.Response) -> BindingError:
        """`"{code}: {message}"` from the envelope's first error, as env.AI reports it; the raw
        body when the answer is not an envelope (a proxy in between, say)."""
        try:
            body = response.json()
        except ValueError:
            body = None
        errors = body.get("errors") if isinstance(body, dict) else None
        first = errors[0] if isinstance(errors, list) and errors else None
        if isinstance(first, dict) and "code" in first:
            code = first["code"]
            return cls(f"{code}: {first.get('message', '')}", code=code,
                       status=response.status_code)
        return cls(response.text or f"HTTP {response.status_code}", status=response.status_code)


class InferenceUpstreamError(BindingError):
    """`run()` or `models()` was answered with an error."""


class AiGatewayLogNotFound(BindingError):
    """`gateway(id).get_log(log_id)`: no such log (or no such gateway) in this account."""


class AiGatewayInternalError(BindingError):
    """`gateway(id).get_log(log_id)` failed for any other reason."""
