"""Everything the gateway's routes share, built once at start-up."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from edgefire.contract.catalog import Catalog
from edgefire.contract.cities import City, all_cities
from edgefire.gateway.accounts import AccountStore
from edgefire.gateway.auth import Authenticator
from edgefire.gateway.batches import BatchStore
from edgefire.gateway.cache import make_cache
from edgefire.gateway.db import Database
from edgefire.gateway.faults import FaultInjector, load_rules
from edgefire.gateway.gateways import GatewayStore
from edgefire.gateway.logs import LogRetention, LogStore
from edgefire.gateway.metrics import GatewayMetrics
from edgefire.gateway.node_auth import NodeCredentials
from edgefire.gateway.pipeline import Pipeline
from edgefire.gateway.plugins import load_gateway_plugins
from edgefire.gateway.providers.base import Provider, ProviderContext
from edgefire.gateway.ratelimit import make_rate_limiter
from edgefire.gateway.redis_link import RedisHealth
from edgefire.gateway.routing.directory import NodeDirectory
from edgefire.gateway.routing.geo import ClientLocator
from edgefire.gateway.settings import GatewaySettings, load_gateway_yaml


@dataclass(slots=True)
class GatewayState:
    settings: GatewaySettings
    catalog: Catalog
    db: Database
    accounts: AccountStore
    gateways: GatewayStore
    logs: LogStore
    auth: Authenticator
    directory: NodeDirectory
    locator: ClientLocator
    providers: dict[str, Provider]
    pipeline: Pipeline
    http: httpx.AsyncClient
    redis_health: RedisHealth | None  # None: no Redis configured
    node_credentials: NodeCredentials
    batches: BatchStore
    metrics: GatewayMetrics
    cities: list[City]
    # (account id, token) the dashboard signs a loopback browser in as: `edge-gateway dev` only
    dev_session: tuple[str, str] | None = field(default=None)

    @classmethod
    def build(cls, settings: GatewaySettings, db: Database | None = None) -> GatewayState:
        catalog = Catalog.load(settings.catalog)
        if db is None:
            settings.gateway_db.parent.mkdir(parents=True, exist_ok=True)
            db = Database(settings.gateway_db)
        accounts, gateways = AccountStore(db), GatewayStore(db)
        logs = LogStore(db, _retention(settings))
        config = load_gateway_yaml(settings.gateway_config)
        credentials = NodeCredentials.load(settings.node_secret, config["nodes"])
        directory = NodeDirectory(
            heartbeat_timeout_s=settings.heartbeat_timeout_s, max_nodes=settings.max_nodes,
            max_models=settings.max_heartbeat_models, startup_hold_s=settings.startup_hold_s)
        cities = all_cities()
        http = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0))
        providers = _providers(catalog, http, directory, credentials, config["providers"],
                               settings.stand_in_model or None)
        faults = FaultInjector(settings.fault_injection, load_rules(config["faults"], catalog),
                               catalog)
        metrics = GatewayMetrics()
        pipeline = Pipeline(providers, make_cache(settings), make_rate_limiter(settings), logs,
                            catalog, faults, metrics)
        redis_health = (RedisHealth(settings.redis_url, settings.redis_timeout_s)
                        if settings.redis_url else None)
        return cls(settings, catalog, db, accounts, gateways, logs, Authenticator(accounts),
                   directory, ClientLocator(config["ip_map"], {c.code: (c.lat, c.lon)
                                                               for c in cities}),
                   providers, pipeline, http, redis_health, credentials,
                   BatchStore(db, settings.batch_retention_s), metrics, cities)

    def interactive_waiting(self) -> bool:
        """A routable node has interactive requests queued: batch work waits for it."""
        return any(node.waiting > 0 for node in self.directory.healthy())

    async def close(self) -> None:
        await self.http.aclose()
        await self.pipeline.cache.close()
        await self.pipeline.limiter.close()
        if self.redis_health is not None:
            await self.redis_health.close()


def _retention(settings: GatewaySettings) -> LogRetention:
    days = settings.log_retention_days
    return LogRetention(settings.log_max_per_gateway, None if days is None else days * 86400)


def _providers(catalog: Catalog, http: httpx.AsyncClient, directory: NodeDirectory,
               credentials: NodeCredentials, configured: dict,
               stand_in_model: str | None) -> dict[str, Provider]:
    """`workers-ai` always; each gateway.yaml provider by its `type` (a provider plugin)."""
    factories = load_gateway_plugins().providers

    def context(section: dict) -> ProviderContext:
        return ProviderContext(catalog, http, directory, credentials, section, stand_in_model)

    providers = {"workers-ai": factories.get("workers-ai")("workers-ai", context({}))}
    for name, section in configured.items():
        providers[name] = factories.get(section.get("type", "openai-compatible"))(
            name, context(section))
    return providers
