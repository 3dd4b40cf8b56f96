"""`amux config show`: the effective configuration, secrets masked, and where each value came from."""
from __future__ import annotations

import argparse
import json
from typing import Any

from .options import server_opts


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add `config show`."""
    cfg = sub.add_parser("config", help="the hub's configuration")
    cfg_sub = cfg.add_subparsers(dest="config_cmd", required=True)
    show = cfg_sub.add_parser("show", help="print the effective configuration (secrets masked) and where each value "
                                           "came from: default, file, env or flag")
    server_opts(show)
    show.add_argument("--json", action="store_true", help="print JSON: {key: {value, source}}")


async def run(args: argparse.Namespace) -> None:
    """Print the configuration the hub would start with from here (the same files, variables and flags)."""
    from ..config_sources import effective, load

    loaded = load(args.config, None, {"database_url": args.db, "listen": args.listen})
    rows = effective(loaded)
    if args.json:
        print(json.dumps({"config_file": str(loaded.config_path),
                          "settings": {k: {"value": v, "source": s} for k, v, s in rows}}, indent=2,
                         ensure_ascii=False))
        return
    width = max(len(k) for k, _, _ in rows)
    print(f"# config file: {loaded.config_path}{'' if loaded.config_path.exists() else ' (absent)'}")
    for key, value, source in rows:
        print(f"{key:<{width}} = {_toml(value)}  # {source}")


def _toml(value: Any) -> str:
    if value is None:
        return "(unset)"
    return json.dumps(value, ensure_ascii=False)
