"""Where a schedule's status notices go, and why not: one decision for the alert pipeline and `schedule get`.

In order: the application frozen on the schedule (a Feishu Turn receipt, or the creator's single active binding
frozen at creation); for a schedule made over MCP/CLI without one, the creator's single active binding now;
with no active binding at all and exactly one Feishu application configured, that application (its
administrator, with the creator principal's name as attribution). A schedule that upgrade recovery left unbound,
one made during a Turn without a valid receipt, or one whose creator has bindings in several applications
stays unattributed: no proactive notices.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ...store.db import Connection, Row
from ...store.records import ScheduleRecord
from ...store.incidents import SqlIncidentStore


@dataclass(frozen=True)
class Route:
    """The application whose administrator is told (None: no proactive notices), and why, in words."""

    app_id: str | None
    basis: str  # frozen | single_binding | sole_app | unbound_by_recovery | turn_without_receipt | no_creator
    #             | several_apps | no_app
    why: str

    def view(self) -> dict:
        """Return the route as `schedule get` shows it."""
        return {"notifies": self.app_id is not None, "app_id": self.app_id, "basis": self.basis, "why": self.why}


async def route(conn: Connection, sched: ScheduleRecord | Row, configured_apps: Sequence[str],
                store: SqlIncidentStore) -> Route:
    """Decide where `sched`'s notices go (reads bindings and recovery results through `store`; writes nothing)."""
    if sched.app_id:
        how = ("its creator's Feishu binding frozen when it was created" if sched.creator_binding_id
               else "its creation receipt")
        return Route(sched.app_id, "frozen", f"notices go to the administrator of {sched.app_id} ({how})")
    if not sched.creator_id:
        return Route(None, "no_creator", "will not notify: it has no attributable creator")
    if await store.left_unbound_by_recovery(conn, sched.id):
        return Route(None, "unbound_by_recovery", "will not notify: upgrade recovery could not prove who created it "
                     "(see `amux db recover-creators --dry-run`); recreate it to attribute it to you")
    if (sched.provenance or {}).get("turn_id"):
        return Route(None, "turn_without_receipt", "will not notify: it was made during a Turn without a valid Feishu "
                     "receipt; recreate it from the chat or over MCP/CLI")
    apps = await store.bound_apps(conn, sched.creator_id)
    if len(apps) == 1:
        return Route(apps[0], "single_binding", f"notices go to the administrator of {apps[0]} "
                     "(its creator's only linked Feishu identity)")
    if len(apps) > 1:
        return Route(None, "several_apps", f"will not notify: its creator has linked identities in {', '.join(apps)}; "
                     "recreate it from the chat of the application that should be told, or unlink the others "
                     "(`amux identity unlink`)")
    if len(configured_apps) == 1:
        return Route(configured_apps[0], "sole_app", f"notices go to the administrator of {configured_apps[0]} "
                     "(the only Feishu application), naming its creator; link your identity with `amux identity link` "
                     "to see it in your own view")
    if not configured_apps:
        return Route(None, "no_app", "will not notify: no Feishu application is configured ([[feishu.apps]])")
    return Route(None, "no_app", "will not notify: its creator has no linked Feishu identity and several applications "
                 "are configured; run `amux identity link` and send the code to the bot")
