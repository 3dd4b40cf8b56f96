"""What every command group shares: the option sets (global, server, database, client), argument types that refuse
naming the fix, and how a command prints (text, or JSON with --json)."""
from __future__ import annotations

import argparse
import json
from typing import Any, Callable

from ..errors import Invalid
from .discovery import DEFAULT_HUB

HUB_HELP = f"hub URL (default $AMUX_HUB_URL, else $AMUX_HOME/hub.json, else {DEFAULT_HUB})"
TOKEN_HELP = "API token (default $AMUX_TOKEN, else $AMUX_HOME/admin.token)"
HOME_HELP = "the amux home: database, tokens, hub.json (default $AMUX_HOME, else ./.amux)"


def emit(args: argparse.Namespace, data: Any, human: str | None = None) -> None:
    """Print `data` as JSON (with --json, or when there is no `human` text), else the `human` text."""
    if getattr(args, "json", False) or human is None:
        print(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        print(human)


def global_opts(ap: argparse.ArgumentParser) -> None:
    """Add --hub/--home/--token before the subcommand (a subcommand's own copy, when given, wins)."""
    ap.add_argument("--hub", help=HUB_HELP)
    ap.add_argument("--home", help=HOME_HELP)
    ap.add_argument("--token", help=TOKEN_HELP)


def server_opts(p: argparse.ArgumentParser, *, listen: bool = True) -> None:
    """Add the options of a command that opens the database itself (`listen`: one that also serves)."""
    if listen:
        p.add_argument("--listen", help="HOST:PORT (default 127.0.0.1:8787; port 0 picks a free one)")
    p.add_argument("--db", help="database URL (default sqlite in $AMUX_HOME)")
    p.add_argument("--config", help="TOML config file (default $AMUX_HOME/amux.toml)")
    p.add_argument("--home", default=argparse.SUPPRESS, help=HOME_HELP)


def db_opts(p: argparse.ArgumentParser) -> None:
    """Add the options of a command that opens the database but serves nothing (no --listen)."""
    server_opts(p, listen=False)


def client_opts(p: argparse.ArgumentParser) -> None:
    """Add the options of a command that calls a hub over HTTP (unset ones leave the global ones alone)."""
    p.add_argument("--hub", default=argparse.SUPPRESS, help=HUB_HELP)
    p.add_argument("--home", default=argparse.SUPPRESS, help=HOME_HELP)
    p.add_argument("--token", default=argparse.SUPPRESS, help=TOKEN_HELP)
    p.add_argument("--json", action="store_true", help="print JSON")


def argument(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type from a parser that refuses with Invalid (its message names the fix)."""
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except Invalid as e:
            raise argparse.ArgumentTypeError(e.message) from None
    return convert
