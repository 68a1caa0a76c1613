"""The edge node's HTTP server (Starlette): `create_app(node)`."""

from edgefire.runtime.server.app import create_app

__all__ = ["create_app"]
