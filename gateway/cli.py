"""`edge-gateway`: run the gateway, manage accounts and tokens, or start a local dev fleet."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edgefire.contract.commands import run_command
from edgefire.contract.log_setup import configure_logging
from edgefire.gateway.cli_accounts import add_account_commands
from edgefire.gateway.db import Database
from edgefire.gateway.settings import GatewaySettings


def _start(args: argparse.Namespace) -> int:
    import uvicorn

    from edgefire.gateway.app import create_app
    from edgefire.gateway.node_auth import require_configured
    from edgefire.gateway.state import GatewayState

    settings = _settings(args)
    state = GatewayState.build(settings)
    require_configured(state.node_credentials)  # else anyone could register a node
    app = create_app(state)
    uvicorn.run(app, host=settings.gateway_host, port=settings.gateway_port, log_level="info")
    return 0


def _dev(args: argparse.Namespace) -> int:
    from edgefire.gateway.dev import run_dev_fleet

    return run_dev_fleet(_settings(args), args.city, Path(args.dev_file), args.node_port,
                         args.pd)


def _plugins(args: argparse.Namespace) -> int:
    from edgefire.gateway.plugins import load_gateway_plugins

    for line in load_gateway_plugins().listing():
        print(line)
    return 0


def _settings(args: argparse.Namespace) -> GatewaySettings:
    overrides = {}
    if getattr(args, "config", None):
        overrides["gateway_config"] = Path(args.config)
    if getattr(args, "port", None):
        overrides["gateway_port"] = args.port
    return GatewaySettings(**overrides)


def main(argv: list[str] | None = None) -> int:
    configure_logging()
    parser = argparse.ArgumentParser(prog="edge-gateway")
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="serve the gateway")
    start.add_argument("--config", help="gateway.yaml: providers and an IP → city map")
    start.add_argument("--port", type=int)
    start.set_defaults(func=_start)
    dev = sub.add_parser("dev", help="a gateway plus edge nodes and a development account")
    dev.add_argument("--city", action="append", default=None, help="repeatable; default fra")
    dev.add_argument("--config")
    dev.add_argument("--port", type=int)
    dev.add_argument("--dev-file", default=".edgefire/dev.json")
    dev.add_argument("--node-port", type=int, help="first node's port (the next city takes the "
                     "next one); default: each city's own")
    dev.add_argument("--pd", action="store_true",
                     help="prefill/decode disaggregated: a prefill and a decode node per city")
    dev.set_defaults(func=_dev)
    sub.add_parser("plugins", help="list the gateway's plugins and what each registers"
                   ).set_defaults(func=_plugins)

    def open_db() -> Database:
        path = GatewaySettings().gateway_db
        path.parent.mkdir(parents=True, exist_ok=True)
        return Database(path)

    add_account_commands(sub, open_db)
    return run_command(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
