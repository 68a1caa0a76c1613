"""What the dashboard (and any client) reads of the fleet and the gateway's own numbers.

  GET {ACCOUNT}/ai/fleet                  cities, health, load, loaded models, hosting verdicts
  GET {ACCOUNT}/ai/metrics/history        the account's charts over the last minutes
  GET /metrics                            Prometheus text, every account (admin token)
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response

from edgefire.contract.bodies import page_number
from edgefire.contract.envelope import success
from edgefire.contract.errors import InvalidInputError
from edgefire.gateway.auth import check_admin
from edgefire.gateway.fleet_view import fleet_view
from edgefire.gateway.metrics_history import MAX_WINDOW_S, MetricsHistory
from edgefire.gateway.routing.placement import Placement
from edgefire.gateway.state import GatewayState

DEFAULT_WINDOW_S = 300


class ObserveRoutes:
    def __init__(self, state: GatewayState, history: MetricsHistory) -> None:
        self.state = state
        self.history = history
        self.placement = Placement()  # its verdicts are cached: the dashboard polls

    def _account(self, request: Request) -> str:
        account_id = request.path_params["account_id"]
        self.state.auth.check(request.headers, account_id)
        return account_id

    async def fleet(self, request: Request) -> Response:
        self._account(request)
        state = self.state
        return success(fleet_view(state.directory, state.cities, state.catalog,
                                  self.placement))

    async def metrics_history(self, request: Request) -> Response:
        account_id = self._account(request)
        window = page_number(request.query_params, "window_s", DEFAULT_WINDOW_S)
        if not 10 <= window <= MAX_WINDOW_S:
            raise InvalidInputError(f"window_s must be 10..{MAX_WINDOW_S}", field="window_s")
        return success(self.history.series(account_id, window))

    async def prometheus(self, request: Request) -> Response:
        check_admin(request.headers, self.state.settings.admin_token, "/metrics")
        return Response(generate_latest(self.state.metrics.registry),
                        media_type=CONTENT_TYPE_LATEST)
