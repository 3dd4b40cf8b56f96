"""`amux profile add | list`: stored manifest-v2 profiles beside the builtin shortcuts, over REST."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .client import client
from .options import client_opts, emit


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add `profile add|list`."""
    prof = sub.add_parser("profile", help="profiles (manifest v2)")
    prof_sub = prof.add_subparsers(dest="profile_cmd", required=True)
    pa = prof_sub.add_parser("add", help="store a v2 manifest (JSON or TOML; admin)")
    client_opts(pa)
    pa.add_argument("file", help="manifest file, or - for stdin")
    client_opts(prof_sub.add_parser("list", help="builtin and stored profiles"))


async def run(args: argparse.Namespace) -> None:
    """Run one `amux profile` command."""
    api = client(args)
    if args.profile_cmd == "add":
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        res = await api.call("POST", "profiles", data=text)
        emit(args, res, f"stored profile {res['name']} ({res['engine']}, {res['digest']})")
    else:
        data = await api.call("GET", "profiles")
        emit(args, data, "\n".join(f"{p['name']:<16} {p['engine']:<9} {p['kind']:<9} {p['description']}"
                                   for p in data["profiles"]))
