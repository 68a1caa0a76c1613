"""edgefire's client: the Workers `env.AI` binding for Python (`from edgefire import AI`)."""

from edgefire.binding import AI, Gateway
from edgefire.errors import (
    AiGatewayInternalError,
    AiGatewayLogNotFound,
    BindingError,
    InferenceUpstreamError,
)

__all__ = ["AI", "AiGatewayInternalError", "AiGatewayLogNotFound", "BindingError", "Gateway",
           "InferenceUpstreamError"]
