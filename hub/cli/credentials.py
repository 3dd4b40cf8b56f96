"""`amux credential declare | set | list`: credential profiles (declared variables, values encrypted per
principal), over REST."""
from __future__ import annotations

import argparse
import sys

from .client import client
from .options import client_opts, emit


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add `credential declare|set|list`."""
    cred = sub.add_parser("credential", help="credential profiles")
    cred_sub = cred.add_subparsers(dest="cred_cmd", required=True)
    cd = cred_sub.add_parser("declare", help="declare the variables a launch needs (admin)")
    client_opts(cd)
    cd.add_argument("name", help="the credential profile's name")
    cd.add_argument("--env", action="append", required=True, help="variable name (repeatable)")
    cs = cred_sub.add_parser("set", help="store your value for one variable (read from stdin)")
    client_opts(cs)
    cs.add_argument("name", help="the credential profile's name")
    cs.add_argument("env_name", help="the variable to set (one it declares)")
    client_opts(cred_sub.add_parser("list", help="declared credential profiles"))


async def run(args: argparse.Namespace) -> None:
    """Run one `amux credential` command."""
    api = client(args)
    if args.cred_cmd == "declare":
        res = await api.call("PUT", f"credentials/{args.name}", {"env": args.env})
        emit(args, res, f"credential profile {res['name']} declares {', '.join(res['env'])}")
    elif args.cred_cmd == "set":
        value = sys.stdin.readline().rstrip("\n")
        res = await api.call("PUT", f"credentials/{args.name}/{args.env_name}", {"value": value})
        emit(args, res, f"stored {args.env_name} for credential profile {args.name} (encrypted)")
    else:
        data = await api.call("GET", "credentials")
        emit(args, data, "\n".join(f"{c['name']:<16} {', '.join(c['env'])}" for c in data["credential_profiles"]))
