"""`edge-gateway accounts …` and `edge-gateway token …`: manage accounts and API tokens."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from contextlib import closing

from edgefire.contract.errors import EdgefireError, NotFoundError
from edgefire.gateway.accounts import AccountStore
from edgefire.gateway.db import Database, iso_time

Handler = Callable[[AccountStore, argparse.Namespace], int]


def _accounts_create(store: AccountStore, args: argparse.Namespace) -> int:
    # Only the id goes to stdout, so `ACCOUNT=$(edge-gateway accounts create me)` works.
    print(store.create_account(args.name, account_id=args.id).id)
    return 0


def _accounts_list(store: AccountStore, args: argparse.Namespace) -> int:
    for account in store.list_accounts():
        print(f"{account.id}  {iso_time(account.created_at)}  {account.name}")
    return 0


def _token_create(store: AccountStore, args: argparse.Namespace) -> int:
    info, token = store.create_token(args.account, name=args.name)
    print(token)
    print(f"token id {info.id} for account {info.account_id}. Store the token now: only its hash "
          "is kept, so it cannot be shown again.", file=sys.stderr)
    return 0


def _token_revoke(store: AccountStore, args: argparse.Namespace) -> int:
    if not store.revoke_token(args.token_id):
        raise NotFoundError(f"no active token with id {args.token_id}", field="token_id")
    print(f"revoked {args.token_id}")
    return 0


def _token_list(store: AccountStore, args: argparse.Namespace) -> int:
    if store.get_account(args.account) is None:
        raise NotFoundError(f"no account {args.account}", field="account_id")
    for token in store.list_tokens(args.account):
        state = "active" if token.active else f"revoked {iso_time(token.revoked_at)}"
        print(f"{token.id}  {iso_time(token.created_at)}  {state:32}  {token.name}")
    return 0


def add_account_commands(subparsers: argparse._SubParsersAction,
                         open_db: Callable[[], Database]) -> None:
    """Add the `accounts` and `token` command groups; each sets `func(args) -> exit status`."""

    def command(handler: Handler) -> Callable[[argparse.Namespace], int]:
        def run(args: argparse.Namespace) -> int:
            try:
                with closing(open_db()) as db:
                    return handler(AccountStore(db), args)
            except EdgefireError as exc:
                print(f"error {exc.code}: {exc.message}", file=sys.stderr)
                return 2
        return run

    accounts = subparsers.add_parser("accounts", help="create and list accounts")
    accounts_sub = accounts.add_subparsers(dest="accounts_command", required=True)
    create = accounts_sub.add_parser("create", help="create an account and print its id")
    create.add_argument("name")
    create.add_argument("--id", default=None,
                        help="use this 32-hex-character account id (e.g. your Cloudflare one)")
    create.set_defaults(func=command(_accounts_create))
    accounts_sub.add_parser("list", help="list accounts").set_defaults(
        func=command(_accounts_list))

    token = subparsers.add_parser("token", help="create, list and revoke API tokens")
    token_sub = token.add_subparsers(dest="token_command", required=True)
    create = token_sub.add_parser("create", help="create a token and print it (once)")
    create.add_argument("--account", required=True, help="account id")
    create.add_argument("--name", default="default")
    create.set_defaults(func=command(_token_create))
    revoke = token_sub.add_parser("revoke", help="revoke a token by its id")
    revoke.add_argument("token_id")
    revoke.set_defaults(func=command(_token_revoke))
    listing = token_sub.add_parser("list", help="list an account's tokens (never the secrets)")
    listing.add_argument("--account", required=True, help="account id")
    listing.set_defaults(func=command(_token_list))
