"""How the three commands (`edgefire`, `edge-node`, `edge-gateway`) end: a user's mistake is one
line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import argparse
import sys

from edgefire.contract.errors import EdgefireError


def run_command(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parse argv and run the chosen subcommand's `func(args)`; its exit status."""
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except EdgefireError as exc:
        print(f"{parser.prog}: error {exc.code}: {exc.message}", file=sys.stderr)
    except ValueError as exc:  # a bad city file or flag value found past argparse
        print(f"{parser.prog}: {exc}", file=sys.stderr)
    return 2
