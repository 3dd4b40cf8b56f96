"""`amux token create` (on the operator's database) and `amux token list | revoke` (over REST)."""
from __future__ import annotations

import argparse

from .client import client
from .discovery import home_settings
from .options import client_opts, db_opts, emit


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add `token create|list|revoke`."""
    tok = sub.add_parser("token", help="API tokens")
    tok_sub = tok.add_subparsers(dest="token_cmd", required=True)
    tc = tok_sub.add_parser("create", help="create a token (shown once)")
    db_opts(tc)
    tc.add_argument("--principal", required=True, help="who the token acts as (created if new)")
    tc.add_argument("--label", help="a name for the token, shown by `amux token list`")
    tc.add_argument("--admin", action="store_true", help="an admin token (with --runner: a shared runner token)")
    tc.add_argument("--runner", action="store_true", help="a runner token: only connects `amux runner` (/runner/ws)")
    tc.add_argument("--kind", default="user", choices=["user", "service", "runtime"], help="the principal's kind")
    tc.add_argument("--json", action="store_true", help="print JSON")
    tl = tok_sub.add_parser("list", help="your tokens (id, kind, label, created, last used, revoked) and live OAuth "
                                         "grants (id, client, scopes, approving token, created)")
    client_opts(tl)
    tl.add_argument("--all", action="store_true", help="every principal's tokens (admin)")
    tr = tok_sub.add_parser("revoke", help="revoke a token and the OAuth grants it approved, or one grant (yours, "
                                           "or anyone's as an admin)")
    client_opts(tr)
    tr.add_argument("id", help="the token id (tok_…) or grant id (og_…), from `amux token list`")


async def _create(args: argparse.Namespace) -> None:
    from ..app import Hub
    from ..store.db import upgrade

    settings = home_settings(args)
    await upgrade(settings.db_url())
    hub = Hub(settings)
    try:
        token = await hub.auth.create_token(args.principal, label=args.label, admin=args.admin, kind=args.kind,
                                            runner=args.runner)
    finally:
        await hub.db.close()
    kind = "runner" if args.runner else "admin" if args.admin else "user"
    emit(args, {"id": "tok_" + token.split(".")[1], "principal": args.principal, "kind": kind,
                "label": args.label or ("runner" if args.runner else None), "admin": args.admin and not args.runner,
                "shared": args.admin and args.runner, "token": token},
         f"{token}\n(shown once; store it now — only its hash is kept)")


async def run(args: argparse.Namespace) -> None:
    """`amux token create` works on the database (the operator's); `list` and `revoke` go through REST."""
    if args.token_cmd == "create":
        await _create(args)
        return
    api = client(args)
    if args.token_cmd == "list":
        res = await api.call("GET", "tokens", params={"all": "1"} if args.all else None)
        lines = [f"{t['id']}  {t['kind']:<6} {t['principal']:<16} {t['label'] or '-':<24} created {t['created'][:19]}  "
                 f"last used {(t['last_used'] or '-')[:19]}  "
                 f"{'revoked ' + t['revoked'][:19] if t['revoked'] else 'active'}"
                 for t in res["tokens"]]
        lines += [f"{g['id']}  grant  {g.get('principal') or '-':<16} {g['client']:<24} "
                  f"scopes {' '.join(g['scopes'])}  approved by {g['approved_by'] or 'a browser sign-in'}  "
                  f"created {g['created'][:19]}"
                  for g in res.get("grants", [])]
        emit(args, res, "\n".join(lines) or "no tokens")
    else:
        t = await api.call("DELETE", f"tokens/{args.id}")
        emit(args, t, f"{t['id']}: revoked")
