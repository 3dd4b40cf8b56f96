"""`amux runtime list | deregister NAME` over REST: the registered runtimes, and freeing a name."""
from __future__ import annotations

import argparse

from ..domain.limits import limits_text
from .client import client
from .options import client_opts, emit


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `amux runtime …`."""
    rt = subparsers.add_parser("runtime", help="registered runtimes (runners)")
    sub = rt.add_subparsers(dest="runtime_cmd", required=True)
    client_opts(sub.add_parser("list", help="every registered runtime: name, status, slots"))
    de = sub.add_parser("deregister", help="free a runtime name and its runner-token binding (the owner, or an "
                                           "admin), while its runner is stopped")
    client_opts(de)
    de.add_argument("name", help="the runtime's name, from `amux runtime list`")


async def run(args: argparse.Namespace) -> None:
    """Run one `amux runtime` command."""
    api = client(args)
    if args.runtime_cmd == "list":
        res = await api.call("GET", "runtimes")
        emit(args, res, "\n".join(_line(r) for r in res["runtimes"]) or "no runtimes; start one with `amux runner`")
    else:
        res = await api.call("DELETE", f"runtimes/{args.name}")
        emit(args, res, f"{res['name']}: deregistered")


def _line(r: dict) -> str:
    """One runtime: name, status, slots and, where its runner says, each child's limits."""
    limits = (r.get("capabilities") or {}).get("limits")
    line = f"{r['name']:<24} {r['status']:<8} slots {r['slots']}"
    return f"{line}  limits {limits_text(limits)}" if limits else line
