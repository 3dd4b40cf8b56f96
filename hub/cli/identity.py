"""`amux identity link | list [--all] | unlink BINDING_ID | execution NAME --revoke|--restore` over REST
(DESIGN §7 "Identities")."""
from __future__ import annotations

import argparse

from ..domain.durations import duration_text
from .client import client
from .options import client_opts, emit


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `amux identity …`."""
    idp = subparsers.add_parser("identity", help="Feishu identities linked to your principal")
    sub = idp.add_subparsers(dest="identity_cmd", required=True)
    client_opts(sub.add_parser("link",
                               help="print a one-time code (10 minutes) to send as `/amux link CODE` in Feishu"))
    ls = sub.add_parser("list", help="your identity bindings (active and revoked)")
    client_opts(ls)
    ls.add_argument("--all", action="store_true", help="everyone's (admin token)")
    un = sub.add_parser("unlink", help="revoke one of your identity bindings")
    client_opts(un)
    un.add_argument("binding_id", help="the binding id (ib_…), from `amux identity list`")
    ex = sub.add_parser("execution", help="revoke or restore a principal's execution access (admin): while revoked, "
                                          "its Feishu schedule views and card actions show nothing")
    client_opts(ex)
    ex.add_argument("principal", help="the principal's name")
    which = ex.add_mutually_exclusive_group(required=True)
    which.add_argument("--revoke", action="store_true", help="revoke its execution access")
    which.add_argument("--restore", action="store_true", help="restore its execution access")


def _line(b: dict) -> str:
    return (f"{b['binding_id']}  {b['status']:<8} {b['app_id']}  {b['open_id']}  principal={b['principal']}"
            f"  since {(b['created_at'] or '-')[:19]}")


async def run(args: argparse.Namespace) -> None:
    """Run one `amux identity` command."""
    api = client(args)
    if args.identity_cmd == "link":
        res = await api.call("POST", "identity/link-codes")
        emit(args, res, f"{res['code']}\nSend `/amux link {res['code']}` to the amux bot in Feishu within "
                        f"{duration_text(res['valid_s'])} (until {res['expires_at'][:19]}Z); it links that "
                        "Feishu identity "
                        f"to {res['principal']}. The code works once.")
    elif args.identity_cmd == "list":
        res = await api.call("GET", "identities", params={"all": "1"} if args.all else None)
        emit(args, res, "\n".join(_line(b) for b in res["identities"])
             or "no linked identities; run `amux identity link` and send the code to the bot")
    elif args.identity_cmd == "execution":
        res = await api.call("PUT", f"principals/{args.principal}/execution", {"revoked": bool(args.revoke)})
        emit(args, res, f"{res['principal']}: execution access "
                        f"{'restored' if res['execution_access'] else 'revoked at ' + res['revoked_at'][:19] + 'Z'}")
    else:
        res = await api.call("DELETE", f"identities/{args.binding_id}")
        emit(args, res, f"{res['binding_id']}: {res['status']} ({res['app_id']} {res['open_id']})")
