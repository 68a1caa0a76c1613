"""A short soak (bench/soak.py) of a fresh `make run` fleet: its own verdict must hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.soak import parse_args, soak
from bench.soak_fleet import private_fleet, warm_up
from bench.soak_mix import MIX

pytestmark = pytest.mark.slow


def test_a_short_soak_has_no_server_failure_and_leaks_no_kv_blocks():
    args = parse_args(["--clients", "16", "--duration", "30", "--settle-timeout", "30"])
    with private_fleet("fra") as fleet:
        warm_up(fleet)
        result = soak(fleet, args)
    assert result["checks"]["no_unexpected_5xx"], result["unexpected_samples"]
    assert result["checks"]["no_unanswered_requests"], result["kinds"]
    assert result["checks"]["no_kv_leak"], result["kv_blocks"]
    assert set(result["kinds"]) == {kind.__name__ for kind, _ in MIX}  # every kind was sent
    assert not _alive(fleet.node_pid)  # the fleet is stopped with its node, as by Ctrl-C


def _alive(pid: int | None) -> bool:
    assert pid is not None
    try:  # a zombie has exited; only its parent has not collected it yet
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
