"""`amux db upgrade` (apply migrations) and `amux db recover-creators [--dry-run] [--db URL] [--json]` (bind
existing schedules to their creators once)."""
from __future__ import annotations

import argparse

from .discovery import home_settings
from .options import db_opts, emit


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add `db upgrade` and `db recover-creators`."""
    db = sub.add_parser("db", help="database commands")
    db_sub = db.add_subparsers(dest="db_cmd", required=True)
    dbu = db_sub.add_parser("upgrade", help="apply migrations")
    db_opts(dbu)
    rc = db_sub.add_parser("recover-creators", help="bind existing subtask schedules to their creators' Feishu "
                                                    "alias where provenance is unambiguous (idempotent)")
    db_opts(rc)
    rc.add_argument("--dry-run", action="store_true", help="print what would happen; write nothing")
    rc.add_argument("--json", action="store_true", help="print JSON")


async def run(args: argparse.Namespace) -> None:
    """Run one `amux db` command."""
    if args.db_cmd == "recover-creators":
        await _recover_creators(args)
        return
    from ..store.db import upgrade

    settings = home_settings(args)
    await upgrade(settings.db_url())
    print(f"database at head: {settings.db_url().split('@')[-1]}")


def render(res: dict) -> str:
    """Render a recovery report: one line per schedule, bound / left unbound / ignored, and why."""
    verb = {"bound": "bound", "unbound": "left unbound", "ignored": "ignored"}
    source = {"upgrade": " (the upgrade's time, recorded by the migration)",
              "first_run": " (recorded by the first run)"}.get(res.get("cutoff_source", ""), " (now)")
    head = ("dry run: nothing written; " if res["dry_run"] else "") + f"cutoff {res['cutoff']}{source}"
    lines = [head]
    for e in res["schedules"]:
        where = f" → {e['app_id']} ({e['binding_id']})" if e["outcome"] == "bound" else ""
        again = "  [recorded earlier]" if e["recorded"] else ""
        lines.append(f"{e['schedule_id']}  {e['name']!r} by {e['creator'] or '-'}: {verb[e['outcome']]}{where}: "
                     f"{e['reason']}{again}")
    c = res["counts"]
    lines.append(f"{c['bound']} bound, {c['unbound']} left unbound, {c['ignored']} ignored (new this run)")
    return "\n".join(lines)


async def _recover_creators(args: argparse.Namespace) -> None:
    """Upgrade the database, run recovery and print the report; a dry run upgrades nothing and writes nothing: when
    the schema is behind, it refuses and says so."""
    from ..clock import SystemClock
    from ..errors import Invalid
    from ..services.schedules.recovery import RecoveryService
    from ..store.db import Database, schema_lag, upgrade

    settings = home_settings(args)
    if not args.dry_run:
        await upgrade(settings.db_url())
    db = Database(settings.db_url())
    try:
        lag = await schema_lag(db) if args.dry_run else None
        if lag is not None:
            at = ", ".join(lag[0]) or "no schema at all"
            raise Invalid(f"the database schema is behind this amux ({at}; the code is at {lag[1]}): a dry run writes "
                          "nothing, so it does not upgrade; run `amux db upgrade`, then the dry run again")
        res = await RecoveryService(db, SystemClock()).recover_creators(dry_run=args.dry_run)
    finally:
        await db.close()
    emit(args, res, render(res))
