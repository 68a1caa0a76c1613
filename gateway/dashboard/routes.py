"""The dashboard's own routes: its page at `/`, its assets under /dashboard/, and the dev
sign-in (`edge-gateway dev` signs a browser on this machine in as its dev account).

Everything the pages show they fetch from the public API with the signed-in token, so the
dashboard sees exactly what a client would. The assets ship in the package: no CDN, offline.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from edgefire.contract.errors import NotFoundError
from edgefire.gateway.binding_call import from_this_machine
from edgefire.gateway.state import GatewayState

STATIC = Path(str(files("edgefire.gateway.dashboard"))) / "static"
SESSION_PATH = "/dashboard/session"
# The page loads only its own assets and talks only to this origin; no one may frame it (a
# dev browser is signed in without a click, which a framing page could abuse).
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class DashboardRoutes:
    def __init__(self, state: GatewayState) -> None:
        self.state = state

    def routes(self) -> list:
        return [Route(SESSION_PATH, self.session, methods=["GET"]),
                Mount("/dashboard", StaticFiles(directory=STATIC), name="dashboard")]

    async def page(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers=_PAGE_HEADERS)

    async def session(self, request: Request) -> Response:
        """The dev account and its token, to a browser on this machine of a dev gateway; else
        404, and the page asks for a token."""
        dev = self.state.dev_session
        if dev is None or not from_this_machine(request.scope):
            raise NotFoundError("no dev session: sign in with an account id and API token",
                                field="session")
        account_id, token = dev
        return JSONResponse({"account_id": account_id, "token": token, "mode": "dev"},
                            headers={"Cache-Control": "no-store"})
