"""edgefire's pytest plugin (entry point `pytest11: edgefire`): test code that calls Workers AI
against a real gateway and edge node started inside the test run, or against recordings.

Fixtures: `edgefire_fleet` (session: the gateway's URL, account and token), `edgefire_url`,
`edgefire_ai` (a ready `edgefire.AI` binding) and `edgefire_openai` (an `openai.OpenAI` client on
the gateway's OpenAI routes). `@pytest.mark.edgefire_models("@cf/…")` names the models a test
uses; the node loads all of them once, before the first test runs. `--edgefire-record DIR`
records every inference answer into DIR; `--edgefire-replay DIR` answers from DIR with no node
and no model at all.

Loading the plugin costs nothing: this module imports neither the gateway nor the node (nor
torch); only a test that asks for one of the fixtures starts anything. `-p no:edgefire`
disables it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from edgefire.binding import AI
    from edgefire.testing.fleet import Fleet

MARKER = "edgefire_models"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("edgefire", "edgefire: Workers AI served locally")
    group.addoption("--edgefire-record", metavar="DIR", default=None,
                    help="record every answer the edgefire fixtures' gateway gives into DIR")
    group.addoption("--edgefire-replay", metavar="DIR", default=None,
                    help="answer from the recordings in DIR only: no node, no model")
    group.addoption("--edgefire-replay-speed", metavar="X", type=float, default=None,
                    help="replayed streams keep their recorded timing at 1 (the default), run "
                         "X times faster, or without waits at 0")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--edgefire-record") and config.getoption("--edgefire-replay"):
        raise pytest.UsageError("--edgefire-record and --edgefire-replay are exclusive")
    config.addinivalue_line(
        "markers", f"{MARKER}(*models): the edgefire models the test uses; the node loads "
                   "them before the first test runs")


def _folder(config: pytest.Config, option: str) -> Path | None:
    value = config.getoption(option)
    return None if value is None else config.invocation_params.dir / value


@pytest.fixture(scope="session")
def edgefire_fleet(request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """A gateway and an edge node on free loopback ports for the whole session (the gateway
    alone when replaying), with every model the collected tests mark already loaded."""
    from edgefire.testing.fleet import in_process_fleet

    config = request.config
    record, replay = _folder(config, "--edgefire-record"), _folder(config, "--edgefire-replay")
    with in_process_fleet(record, replay, config.getoption("--edgefire-replay-speed")) as fleet:
        models = {model for item in request.session.items
                  for mark in item.iter_markers(MARKER) for model in mark.args}
        fleet.ensure_models(sorted(models))
        yield fleet


@pytest.fixture(scope="session")
def edgefire_url(edgefire_fleet: Fleet) -> str:
    """The gateway's base URL (http://127.0.0.1:<port>); the account and token are on
    edgefire_fleet (`account_id`, `token`)."""
    return edgefire_fleet.url


@pytest.fixture
def edgefire_ai(edgefire_fleet: Fleet) -> Iterator[AI]:
    """`env.AI` for the fleet's account: `await edgefire_ai.run(model, inputs)`."""
    import httpx

    from edgefire.binding import AI

    # No connection is kept alive: a test may drive the binding from an event loop of its own
    # (asyncio.run, an async test), and a pooled connection belongs to the loop that opened it.
    http = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0), trust_env=False,
                             limits=httpx.Limits(max_keepalive_connections=0))
    yield AI(edgefire_fleet.url, edgefire_fleet.account_id, edgefire_fleet.token, http=http)
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # the usual case: close it on a loop of its own
        asyncio.run(http.aclose())


@pytest.fixture
def edgefire_openai(edgefire_fleet: Fleet) -> Iterator[Any]:
    """An `openai.OpenAI` client whose base URL is the gateway's Workers AI OpenAI routes."""
    try:
        import openai
    except ImportError:
        pytest.fail("the edgefire_openai fixture needs the openai package (pip install openai)",
                    pytrace=False)
    # trust_env off: a proxy from the environment must not stand between tests and loopback.
    client = openai.OpenAI(base_url=edgefire_fleet.openai_base_url, api_key=edgefire_fleet.token,
                           timeout=600.0, http_client=openai.DefaultHttpxClient(trust_env=False))
    yield client
    client.close()
