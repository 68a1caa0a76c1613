"""Gateway persistence: accounts and tokens, gateway objects, logs, pricing and the account CLI."""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing

import pytest

from edgefire.contract.catalog import Catalog
from edgefire.contract.errors import ConflictError, InvalidInputError, NotFoundError
from edgefire.gateway import logs as logs_module
from edgefire.gateway.accounts import AccountStore
from edgefire.gateway.cli_accounts import add_account_commands
from edgefire.gateway.db import Database
from edgefire.gateway.gateways import GatewayStore
from edgefire.gateway.logs import LogRecord, LogRetention, LogStore, new_log_id
from edgefire.gateway.pricing import apply_custom_cost, cost_usd, parse_custom_cost
from tests.redis_support import FakeClock


@pytest.fixture
def db():
    database = Database(":memory:")
    yield database
    database.close()


@pytest.fixture
def two_accounts(db):
    accounts = AccountStore(db)
    return accounts.create_account("alice").id, accounts.create_account("bob").id


# -- accounts and tokens ---------------------------------------------------------------------

def test_token_lifecycle_and_only_a_hash_is_stored(tmp_path):
    path = tmp_path / "gw.db"
    db = Database(path)
    store = AccountStore(db)
    account = store.create_account("alice")
    assert re.fullmatch(r"[0-9a-f]{32}", account.id)
    assert store.get_account(account.id) == account
    info, token = store.create_token(account.id, name="ci")
    assert re.fullmatch(r"ef_[A-Za-z0-9_-]{40}", token)
    assert store.authenticate(token) == account.id
    assert store.authenticate(token + "x") is None
    assert store.authenticate("ef_" + "A" * 40) is None
    assert store.authenticate("") is None

    rows = [dict(row) for row in db.query("SELECT * FROM tokens")]
    assert len(rows) == 1 and rows[0]["id"] == info.id
    assert token not in json.dumps(rows)
    assert rows[0]["token_hash"] != token and len(rows[0]["token_hash"]) == 64
    listed = store.list_tokens(account.id)
    assert [t.id for t in listed] == [info.id] and listed[0].active

    assert store.revoke_token(info.id) is True
    assert store.revoke_token(info.id) is False
    assert store.revoke_token("nope") is False
    assert store.authenticate(token) is None
    assert store.list_tokens(account.id)[0].revoked_at is not None
    db.close()
    on_disk = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert token.encode() not in on_disk


def test_account_validation_and_chosen_ids(db):
    store = AccountStore(db)
    chosen = "0123456789abcdef0123456789abcdef"
    assert store.create_account("mine", account_id=chosen).id == chosen
    with pytest.raises(ConflictError):
        store.create_account("again", account_id=chosen)
    with pytest.raises(InvalidInputError) as bad_id:
        store.create_account("x", account_id="ABC")
    assert bad_id.value.field == "account_id"
    with pytest.raises(InvalidInputError):
        store.create_account("  ")
    with pytest.raises(NotFoundError):
        store.create_token("f" * 32)
    assert store.get_account("f" * 32) is None
    assert [a.id for a in store.list_accounts()] == [chosen]


# -- gateways --------------------------------------------------------------------------------

def test_gateway_crud(db, two_accounts):
    alice, _ = two_accounts
    gateways = GatewayStore(db)
    created = gateways.create(alice, {"id": "my-gw_1", "cache_ttl": 300,
                                      "rate_limiting_limit": 10, "rate_limiting_interval": 60,
                                      "rate_limiting_technique": "sliding"})
    assert created.collect_logs and not created.authentication
    assert created.cache_enabled and created.rate_limit_enabled
    assert gateways.get(alice, "my-gw_1") == created
    body = created.to_json()
    assert body["id"] == "my-gw_1" and body["cache_ttl"] == 300
    assert body["rate_limiting_technique"] == "sliding" and body["collect_logs"] is True
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", body["created_at"])

    # A client that PUTs back what it read (timestamps and id included) changes only what differs.
    updated = gateways.update(alice, "my-gw_1", {**body, "collect_logs": False, "cache_ttl": 0})
    assert not updated.collect_logs and not updated.cache_enabled
    assert updated.rate_limiting_limit == 10 and updated.modified_at >= created.modified_at
    assert gateways.get(alice, "my-gw_1") == updated
    with pytest.raises(ConflictError):
        gateways.create(alice, {"id": "my-gw_1"})
    assert [g.id for g in gateways.list(alice)] == ["my-gw_1"]
    assert gateways.delete(alice, "my-gw_1") is True
    assert gateways.delete(alice, "my-gw_1") is False
    assert gateways.get(alice, "my-gw_1") is None
    with pytest.raises(NotFoundError):
        gateways.update(alice, "my-gw_1", {"collect_logs": True})


@pytest.mark.parametrize(("fields", "field"), [
    ({"id": "Upper"}, "id"),
    ({"id": "x" * 65}, "id"),
    ({}, "id"),
    ({"id": "ok", "cache_ttl": "60"}, "cache_ttl"),
    ({"id": "ok", "cache_ttl": 30}, "cache_ttl"),
    ({"id": "ok", "cache_ttl": 31 * 24 * 3600}, "cache_ttl"),
    ({"id": "ok", "collect_logs": 1}, "collect_logs"),
    ({"id": "ok", "rate_limiting_limit": -1}, "rate_limiting_limit"),
    ({"id": "ok", "rate_limiting_limit": True}, "rate_limiting_limit"),
    ({"id": "ok", "rate_limiting_limit": 5}, "rate_limiting_interval"),
    ({"id": "ok", "rate_limiting_interval": 5}, "rate_limiting_limit"),
    ({"id": "ok", "rate_limiting_technique": "leaky"}, "rate_limiting_technique"),
    ({"id": "ok", "dlp": {}}, "dlp"),
])
def test_gateway_validation_names_the_field(db, two_accounts, fields, field):
    with pytest.raises(InvalidInputError) as caught:
        GatewayStore(db).create(two_accounts[0], fields)
    assert caught.value.field == field


def test_gateway_update_validation_and_id_is_fixed(db, two_accounts):
    alice, _ = two_accounts
    gateways = GatewayStore(db)
    gateways.create(alice, {"id": "gw"})
    with pytest.raises(InvalidInputError) as caught:
        gateways.update(alice, "gw", {"id": "other"})
    assert caught.value.field == "id"
    with pytest.raises(InvalidInputError):
        gateways.update(alice, "gw", {"authentication": "yes"})
    with pytest.raises(InvalidInputError):
        gateways.update(alice, "gw", ["not", "an", "object"])
    assert gateways.get(alice, "gw").authentication is False


def test_gateway_isolation_between_accounts(db, two_accounts):
    alice, bob = two_accounts
    gateways = GatewayStore(db)
    gateways.create(alice, {"id": "shared-name", "cache_ttl": 120})
    assert gateways.get(bob, "shared-name") is None
    assert gateways.list(bob) == []
    with pytest.raises(NotFoundError):
        gateways.update(bob, "shared-name", {"cache_ttl": 60})
    assert gateways.delete(bob, "shared-name") is False
    # The same id is free in another account, and stays separate.
    gateways.create(bob, {"id": "shared-name"})
    assert gateways.get(alice, "shared-name").cache_ttl == 120
    assert gateways.get(bob, "shared-name").cache_ttl is None
    with pytest.raises(NotFoundError):
        gateways.create("0" * 32, {"id": "orphan"})


def test_default_gateway_and_account_limit(db, two_accounts):
    alice, _ = two_accounts
    gateways = GatewayStore(db)
    for n in range(10):
        gateways.create(alice, {"id": f"gw-{n}"})
    with pytest.raises(InvalidInputError):
        gateways.create(alice, {"id": "gw-10"})
    default = gateways.get_or_create_default(alice)
    assert default.id == "default" and default.collect_logs
    assert gateways.get_or_create_default(alice) == default
    assert len(gateways.list(alice)) == 11


# -- logs ------------------------------------------------------------------------------------

def _log(account, gateway="gw", **overrides) -> LogRecord:
    fields = {"account_id": account, "gateway_id": gateway, "provider": "workers-ai",
              "model": "@cf/a", "path": "/workers-ai/@cf/a", "status_code": 200,
              "success": True, "tokens_in": 10, "tokens_out": 5, "duration_ms": 12}
    return LogRecord(**{**fields, **overrides})


def test_log_ids_are_sortable_ulids():
    ids = [new_log_id(1_700_000_000.0) for _ in range(50)] + [new_log_id(1_700_000_000.002)]
    assert all(re.fullmatch(r"[0-9A-HJKMNP-TV-Z]{26}", i) for i in ids)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert new_log_id(1.0) < new_log_id(2.0)


def test_logs_add_get_list_filter_page_order(db, two_accounts):
    alice, _ = two_accounts
    GatewayStore(db).create(alice, {"id": "gw"})
    logs = LogStore(db)
    records = [
        _log(alice, created_at=100.0 + i, success=i % 3 != 0, cached=i % 2 == 0,
             provider="openai" if i >= 8 else "workers-ai", model=f"@cf/m{i % 2}",
             metadata={"user": f"u{i}"} if i == 1 else {}, step=i % 2, node="local")
        for i in range(10)]
    for record in records:
        logs.add(record)

    got = logs.get(alice, "gw", records[1].id)
    assert got == records[1]
    body = got.to_json()
    assert json.loads(body["metadata"]) == {"user": "u1"} and body["duration"] == 12
    assert body["created_at"] == "1970-01-01T00:01:41.000Z"
    assert logs.get(alice, "gw", "01ARZ3NDEKTSV4RRFFQ69G5FAV") is None

    page, total = logs.list(alice, "gw")
    assert total == 10 and [r.id for r in page] == [r.id for r in reversed(records)]
    page, total = logs.list(alice, "gw", page=2, per_page=4, order_desc=False)
    assert total == 10 and [r.created_at for r in page] == [104.0, 105.0, 106.0, 107.0]
    assert logs.list(alice, "gw", page=4, per_page=4) == ([], 10)

    failed, total = logs.list(alice, "gw", success=False)
    assert total == 4 and {r.created_at for r in failed} == {100.0, 103.0, 106.0, 109.0}
    assert logs.list(alice, "gw", cached=True)[1] == 5
    assert logs.list(alice, "gw", provider="openai", model="@cf/m1")[1] == 1
    assert logs.list(alice, "gw", success=True, cached=False, provider="workers-ai")[1] == 3
    for bad in ({"page": 0}, {"per_page": 0}, {"per_page": 101}):
        with pytest.raises(InvalidInputError):
            logs.list(alice, "gw", **bad)


def test_logs_delete_isolation_and_cascade(db, two_accounts):
    alice, bob = two_accounts
    gateways = GatewayStore(db)
    for account in (alice, bob):
        gateways.create(account, {"id": "gw"})
    gateways.create(alice, {"id": "other"})
    logs = LogStore(db)
    alice_log = _log(alice, success=False)
    logs.add(alice_log)
    logs.add(_log(alice))
    logs.add(_log(alice, gateway="other"))
    logs.add(_log(bob))

    assert logs.get(bob, "gw", alice_log.id) is None
    assert logs.get(alice, "other", alice_log.id) is None
    assert logs.list(bob, "gw")[1] == 1
    assert logs.delete(bob, "gw", success=False) == 0
    assert logs.delete(alice, "gw", success=False) == 1
    assert logs.list(alice, "gw")[1] == 1
    assert logs.delete(alice, "gw") == 1
    assert logs.list(bob, "gw")[1] == 1 and logs.list(alice, "other")[1] == 1

    assert gateways.delete(alice, "other")
    gateways.create(alice, {"id": "other"})
    assert logs.list(alice, "other")[1] == 0  # a recreated gateway starts with no logs
    assert gateways.delete(alice, "other")
    with pytest.raises(NotFoundError):
        logs.add(_log(alice, gateway="other"))
    with pytest.raises(sqlite3.IntegrityError):
        logs.add(_log(bob, id=logs.list(bob, "gw")[0][0].id))


def test_logs_keep_the_newest_per_gateway_pruned_in_batches(db, two_accounts):
    alice, bob = two_accounts
    gateways = GatewayStore(db)
    for account, gateway in ((alice, "gw"), (alice, "other"), (bob, "gw")):
        gateways.create(account, {"id": gateway})
    logs = LogStore(db, LogRetention(max_per_gateway=3000))
    assert logs.retention.prune_every == 3
    # Pairs of logs share a timestamp, so the cut also orders by id.
    records = [_log(alice, created_at=1000.0 + i // 2) for i in range(3002)]
    for record in records:
        logs.add(record)
    for account, gateway in ((alice, "other"), (bob, "gw")):
        for _ in range(5):
            logs.add(_log(account, gateway=gateway))
    assert logs.list(alice, "gw")[1] == 3002  # 3002 writes: not yet a batch of 3 since 3000
    logs.add(last := _log(alice, created_at=5000.0))
    page, total = logs.list(alice, "gw", per_page=100, order_desc=False)
    assert total == 3000
    assert [r.id for r in page] == [r.id for r in records[3:103]]  # the oldest three went
    assert logs.get(alice, "gw", last.id) is not None
    assert logs.list(alice, "other")[1] == 5 and logs.list(bob, "gw")[1] == 5


def test_logs_older_than_the_retention_are_pruned(db, two_accounts, monkeypatch):
    alice, bob = two_accounts
    gateways = GatewayStore(db)
    for account in (alice, bob):
        gateways.create(account, {"id": "gw"})
    clock = FakeClock(100_000.0)
    plain, logs = LogStore(db), LogStore(db, LogRetention(max_age_s=3600), clock=clock)
    monkeypatch.setattr(logs_module, "AGE_PRUNE_BATCH", 2)
    for account in (alice, alice, bob, bob, bob):
        plain.add(_log(account, created_at=clock.now - 3601))
    kept = _log(bob, created_at=clock.now - 3599)
    plain.add(kept)

    def remaining() -> int:
        return logs.list(alice, "gw")[1] + logs.list(bob, "gw")[1]

    # The backlog goes a batch per write, whichever gateway the write is for (each write
    # adds one fresh log; five old ones go in batches of 2, 2, 1).
    for expected in (5, 4, 4):
        logs.add(_log(alice, created_at=clock.now))
        assert remaining() == expected
    assert logs.get(bob, "gw", kept.id) is not None
    # Then the next prune waits a minute.
    plain.add(_log(alice, created_at=clock.now - 7200))
    clock.now += 59
    logs.add(_log(alice, created_at=clock.now))
    assert remaining() == 6
    clock.now += 1
    logs.add(_log(alice, created_at=clock.now))
    assert remaining() == 5 and logs.get(bob, "gw", kept.id) is None  # now over an hour old


def test_concurrent_writers_share_one_database(tmp_path):
    db = Database(tmp_path / "threads.db")
    account = AccountStore(db).create_account("alice").id
    gateways, logs = GatewayStore(db), LogStore(db)

    def worker(_: int) -> None:
        gateway = gateways.get_or_create_default(account)
        for _ in range(20):
            logs.add(_log(account, gateway=gateway.id))

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(worker, range(8)))
    assert [g.id for g in gateways.list(account)] == ["default"]
    records, total = logs.list(account, "default", per_page=100)
    assert total == 160 and len({r.id for r in records}) == 100
    db.close()


# -- pricing ---------------------------------------------------------------------------------

PRICES = [{"unit": "per M input tokens", "price": 0.60, "currency": "USD"},
          {"unit": "per M cached input tokens", "price": 0.10, "currency": "USD"},
          {"unit": "per M output tokens", "price": 3.00, "currency": "USD"}]


def test_cost_from_catalog_prices():
    assert cost_usd(None, 10, 10) is None and cost_usd([], 10, 10) is None
    assert cost_usd(PRICES, 1_000_000, 1_000_000) == pytest.approx(3.60)
    assert cost_usd(PRICES, 1_000_000, 0, cached_in=400_000) == pytest.approx(0.36 + 0.04)
    # Without a cached price, cached tokens bill at the input rate.
    assert cost_usd(PRICES[::2], 1000, 0, cached_in=1000) == pytest.approx(0.0006)
    assert cost_usd(PRICES[:1], 0, 1000) == 0.0
    with pytest.raises(ValueError):
        cost_usd([{"unit": "per image", "price": 1}], 1, 1)
    with pytest.raises(ValueError):
        cost_usd([{"unit": "per M input tokens", "price": 1, "currency": "EUR"}], 1, 1)
    # An upstream reporting more cached tokens than prompt tokens bills them all as cached.
    assert cost_usd(PRICES, 10, 0, cached_in=11) == pytest.approx(10 * 0.10 / 1e6)


def test_every_catalog_price_list_is_usable():
    priced = [spec for spec in Catalog.load().specs if spec.extra.get("price")]
    assert priced
    for spec in priced:
        assert cost_usd(spec.extra["price"], 1000, 1000) > 0


def test_custom_cost():
    assert parse_custom_cost(None) is None and parse_custom_cost(" ") is None
    per_token = parse_custom_cost('{"per_token_in": 0.000001, "per_token_out": 0.000002}')
    assert apply_custom_cost(per_token, 1000, 500) == pytest.approx(0.002)
    only_out = parse_custom_cost('{"per_token_out": 1}')
    assert apply_custom_cost(only_out, 1000, 3) == 3.0
    assert apply_custom_cost(parse_custom_cost('{"total_cost": 0.25}'), 1000, 500) == 0.25
    for bad in ("nope", "[1]", "{}", '{"total_cost": -1}', '{"total_cost": true}',
                '{"total_cost": 1, "per_token_in": 1}', '{"per_token_in": "1"}', '{"x": 1}'):
        with pytest.raises(InvalidInputError) as caught:
            parse_custom_cost(bad)
        assert caught.value.field == "cf-aig-custom-cost"


# -- CLI -------------------------------------------------------------------------------------

def test_account_cli_end_to_end(tmp_path, capsys):
    path = tmp_path / "cli.db"
    parser = argparse.ArgumentParser(prog="edge-gateway")
    add_account_commands(parser.add_subparsers(dest="command", required=True),
                         lambda: Database(path))

    def run(*argv: str) -> tuple[int, str, str]:
        args = parser.parse_args(argv)
        status = args.func(args)
        out, err = capsys.readouterr()
        return status, out, err

    status, out, _ = run("accounts", "create", "alice")
    account_id = out.strip()
    assert status == 0 and re.fullmatch(r"[0-9a-f]{32}", account_id)
    status, out, _ = run("accounts", "list")
    assert status == 0 and account_id in out and "alice" in out

    status, out, err = run("token", "create", "--account", account_id, "--name", "laptop")
    token = out.strip()
    assert status == 0 and token.startswith("ef_") and "cannot be shown again" in err
    token_id = re.search(r"token id ([0-9a-f]{32})", err).group(1)
    with closing(Database(path)) as db:
        assert AccountStore(db).authenticate(token) == account_id

    status, out, _ = run("token", "list", "--account", account_id)
    assert status == 0 and token_id in out and "laptop" in out and "active" in out
    assert token not in out and token[3:] not in out
    status, out, _ = run("token", "revoke", token_id)
    assert status == 0 and token_id in out
    status, out, _ = run("token", "list", "--account", account_id)
    assert "revoked" in out
    with closing(Database(path)) as db:
        assert AccountStore(db).authenticate(token) is None

    status, _, err = run("token", "revoke", token_id)
    assert status == 2 and "no active token" in err
    status, _, err = run("token", "create", "--account", "f" * 32)
    assert status == 2 and "no account" in err
    status, _, err = run("token", "list", "--account", "f" * 32)
    assert status == 2 and "no account" in err
