"""`edge-node`: start one city's node, or list the cities this repo ships."""

from __future__ import annotations

import argparse
import logging
import sys

from edgefire.contract.cities import all_cities, load_city
from edgefire.contract.commands import run_command
from edgefire.contract.log_setup import configure_logging


def _start(args: argparse.Namespace) -> int:
    import uvicorn

    from edgefire.runtime.node.node import EdgeNode
    from edgefire.runtime.node.settings import NodeSettings
    from edgefire.runtime.server.app import create_app

    city = load_city(args.city)
    settings = NodeSettings()
    if args.role:
        settings.role = args.role
    port = args.port or city.port
    if settings.public_url is None:  # the gateway must reach the port this node really serves
        settings.public_url = f"http://127.0.0.1:{port}"
    node = EdgeNode(city, settings)
    logging.getLogger(__name__).info("edge node %s (%s) on http://%s:%d", city.code, city.name,
                                     args.host, port)
    uvicorn.run(create_app(node), host=args.host, port=port, log_level="info")
    return 0


def _cities(args: argparse.Namespace) -> int:
    for c in all_cities():
        a = c.accelerators
        print(f"{c.code}  {c.name:10} {c.lat:9.4f} {c.lon:9.4f}  {a.count}x {a.kind} "
              f"({a.gpus.accelerator.memory_gb} GB each)  budget {c.memory_budget_gib:g} GiB  "
              f"port {c.port}")
    return 0


def main(argv: list[str] | None = None) -> int:
    configure_logging()
    parser = argparse.ArgumentParser(prog="edge-node")
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="serve one city's node over HTTP")
    start.add_argument("--city", required=True)
    start.add_argument("--port", type=int, default=None, help="default: the city's port")
    start.add_argument("--host", default="127.0.0.1")
    start.add_argument("--role", choices=("prefill", "decode", "both"),
                       help="default: EDGEFIRE_ROLE, else the city's")
    start.set_defaults(func=_start)
    sub.add_parser("cities", help="list the shipped cities").set_defaults(func=_cities)
    return run_command(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
