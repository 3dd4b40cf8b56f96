"""One authorization policy for schedules: who may read and control which schedule.

Used by every reader: REST and MCP (`ScheduleService`) and the Feishu bot's personal views and card actions
(through `ScheduleService`) — none of them keeps visibility rules of its own.

- The frozen creator: only schedules whose `creator_id` is the caller's principal (an admin token sees
  everyone's over REST/MCP/CLI, as before; a Feishu operator never acts as admin).
- A Feishu operator (a Caller made from an identity binding, `Viewer.caller()`) additionally needs, each a
  check of its own (the seed's four): its own binding still active, the application scope (only schedules
  frozen to this application), an active identity binding of the schedule (its creator binding, still
  active: a schedule recovery left unbound, or made with no binding, is never shown in Feishu), and execution
  access (the principal's execution access not revoked: `amux identity execution NAME --revoke`).

The decision is a `Visibility` value; the store applies it as a filter, so lists and pages stay in the database.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import NotFound
from ...store.db import Connection, Database
from ...store.records import ScheduleRecord
from ...store.ports.schedules import ScheduleStore
from ...store.schedules import SqlScheduleStore, Visibility

FEISHU = "feishu:"


def not_yours(schedule_id: str) -> NotFound:
    """Return the refusal for a schedule the caller may not see (the same whether absent or someone else's)."""
    return NotFound(f"schedule {schedule_id!r} does not exist or is not yours; list yours with schedule_list")


@dataclass(frozen=True)
class FeishuScope:
    """The Feishu identity a Caller acts through: application and identity binding."""

    app_id: str
    binding_id: str


def feishu_scope(caller: Any) -> FeishuScope | None:
    """Return the identity a bot-made Caller acts through (label `feishu:<app>`, token `feishu:<binding>`), else
    None."""
    label, token = getattr(caller, "label", None) or "", getattr(caller, "token_id", None) or ""
    if label.startswith(FEISHU) and token.startswith(FEISHU):
        return FeishuScope(label[len(FEISHU):], token[len(FEISHU):])
    return None


class ScheduleAccess:
    """Decide which schedules a caller may see and act on (the one decision)."""

    def __init__(self, db: Database) -> None:
        self.store: ScheduleStore = SqlScheduleStore(db)

    async def visibility(self, conn: Connection, caller: Any, *, include_deleted: bool = False,
                         everyone: bool = False) -> Visibility:
        """Return the schedules `caller` may read and control.

        `everyone` widens an admin token's view to every principal's schedules; it never widens a Feishu operator's.
        """
        scope = feishu_scope(caller)
        if scope is None:
            creator = None if everyone and caller.admin else caller.principal_id
            return Visibility(creator_id=creator, include_deleted=include_deleted)
        return await self.for_identity(conn, caller.principal_id, scope, include_deleted=include_deleted)

    async def for_identity(self, conn: Connection, principal_id: str, scope: FeishuScope, *,
                           include_deleted: bool = False) -> Visibility:
        """Return what a Feishu identity of `principal_id` in `scope.app_id` may see, checked now (module rules)."""
        active = {b.id: b.app_id for b in await self.store.active_bindings(conn, principal_id)}
        if active.get(scope.binding_id) != scope.app_id:  # its own binding was revoked (or is not this app's)
            return Visibility(creator_id=principal_id, nothing=True)
        if not await self.store.execution_access(conn, principal_id):
            return Visibility(creator_id=principal_id, nothing=True)
        return Visibility(creator_id=principal_id, app_id=scope.app_id, creator_bindings=frozenset(active),
                          include_deleted=include_deleted)

    async def schedule(self, conn: Connection, caller: Any, schedule_id: str, *, lock: bool = False,
                       include_deleted: bool = False) -> ScheduleRecord:
        """Return a schedule the caller may read and control (an admin token: anyone's), or refuse with NotFound;
        `lock` holds its row until the transaction ends."""
        v = await self.visibility(conn, caller, include_deleted=include_deleted, everyone=True)
        row = await self.store.get(conn, schedule_id, v, lock=lock)
        if row is None:
            raise not_yours(schedule_id)
        return row
