"""`amux memory get | set | delete | list`: hub memory of this conversation's scope, over REST (task children use
it with their run's token)."""
from __future__ import annotations

import argparse
import sys

from .client import client
from .options import client_opts, emit


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add `memory …`."""
    mem = sub.add_parser("memory", help="hub memory of this conversation's scope (for task children)")
    mem_sub = mem.add_subparsers(dest="memory_cmd", required=True)
    for name, text in (("get", "print the value of a key"), ("set", "store a value under a key"),
                       ("delete", "delete a key"), ("list", "list the keys")):
        mp = mem_sub.add_parser(name, help=text)
        client_opts(mp)
        if name != "list":
            mp.add_argument("key", help="the memory key")
        if name == "set":
            mp.add_argument("value", nargs="?", help="the value ('-' or omitted: stdin)")


async def run(args: argparse.Namespace) -> None:
    """Run one `amux memory` command."""
    api = client(args)
    if args.memory_cmd == "get":
        res = await api.call("GET", f"memory/{args.key}")
        emit(args, res, res["value"])
    elif args.memory_cmd == "set":
        value = args.value if args.value not in (None, "-") else sys.stdin.read()
        res = await api.call("PUT", f"memory/{args.key}", {"value": value})
        emit(args, res, f"stored {args.key} in {res['scope']}")
    elif args.memory_cmd == "delete":
        res = await api.call("DELETE", f"memory/{args.key}")
        emit(args, res, f"deleted {args.key} from {res['scope']}")
    else:
        res = await api.call("GET", "memory")
        emit(args, res, "\n".join(res["keys"]))
