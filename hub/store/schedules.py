"""Schedule definitions, who can see them, and the identity facts their attribution reads (the firing ledger is in
`firings.py`, creator recovery in `recovery.py`)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from ..domain.states import BindingStatus
from .db import Connection, Database
from .records import ScheduleRecord, record, records
from .tables import feishu_apps, identity_bindings, incidents, principals, schedules, task_runs


@dataclass(frozen=True, kw_only=True)
class Visibility:
    """Which schedules one caller may see and act on, as `hub/services/schedules/access.py` decided it.

    Every field narrows: `creator_id` None means any creator's (an admin asking for everyone's);
    `app_id` keeps only schedules frozen to that application; `creator_bindings` keeps only schedules whose
    creator binding is one of these (a schedule without one is left out); `nothing` matches no schedule;
    deleted schedules only with `include_deleted`.
    """

    creator_id: str | None
    app_id: str | None = None
    creator_bindings: frozenset[str] | None = None
    include_deleted: bool = False
    nothing: bool = False


@dataclass(frozen=True)
class Binding:
    """One identity binding: its id, principal, application and status."""

    id: str
    principal_id: str
    app_id: str
    status: str


def visible_clause(v: Visibility) -> sa.ColumnElement[bool]:
    """Return the WHERE clause of the schedules `v` admits."""
    if v.nothing:
        return sa.false()
    clauses: list[sa.ColumnElement[bool]] = []
    if v.creator_id is not None:
        clauses.append(schedules.c.creator_id == v.creator_id)
    if v.app_id is not None:
        clauses.append(schedules.c.app_id == v.app_id)
    if v.creator_bindings is not None:
        clauses.append(schedules.c.creator_binding_id.in_(sorted(v.creator_bindings)))
    if not v.include_deleted:
        clauses.append(schedules.c.deleted_at.is_(None))
    return sa.and_(sa.true(), *clauses)


class SqlScheduleStore:
    """Schedule definitions on SQLite and PostgreSQL."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # ------------------------------------------------------------ definitions

    async def insert(self, conn: Connection, values: dict[str, Any]) -> None:
        """Insert one schedule definition with the columns given (the caller validated them)."""
        await conn.execute(schedules.insert().values(**values))

    async def get(self, conn: Connection, schedule_id: str, v: Visibility, *,
                  lock: bool = False) -> ScheduleRecord | None:
        """Return the schedule when `v` admits it, else None; with `lock`, hold its row until the transaction ends."""
        stmt = sa.select(schedules).where(schedules.c.id == schedule_id, visible_clause(v))
        result = await conn.execute(self.db.for_update(stmt) if lock else stmt)
        return record(ScheduleRecord, result.mappings().first())

    async def update(self, conn: Connection, schedule_id: str, values: dict[str, Any]) -> None:
        """Write the given columns of one schedule; other columns keep their values."""
        await conn.execute(schedules.update().where(schedules.c.id == schedule_id).values(**values))

    async def mark_deleted(self, conn: Connection, schedule_id: str, now: datetime) -> None:
        """Mark a schedule deleted at `now` and stop its firing; the row and its firings stay (history)."""
        await conn.execute(schedules.update().where(schedules.c.id == schedule_id)
                           .values(deleted_at=now, next_fire_at=None, updated_at=now))

    async def visible(self, conn: Connection, v: Visibility, *, limit: int | None,
                      offset: int = 0) -> list[ScheduleRecord]:
        """Return up to `limit` (None: all) schedules `v` admits, newest first (ties by id), each with its
        `creator_name`."""
        stmt = (sa.select(schedules, principals.c.name.label("creator_name"))
                .outerjoin(principals, principals.c.id == schedules.c.creator_id).where(visible_clause(v))
                .order_by(schedules.c.created_at.desc(), schedules.c.id).offset(offset).limit(limit))
        return records(ScheduleRecord, (await conn.execute(stmt)).mappings())

    async def count_visible(self, conn: Connection, v: Visibility) -> int:
        """Return how many schedules `v` admits."""
        stmt = sa.select(sa.func.count()).select_from(schedules).where(visible_clause(v))
        return int((await conn.execute(stmt)).scalar() or 0)

    async def execution_access(self, conn: Connection, principal_id: str) -> bool:
        """Return whether the principal exists and its execution access is not revoked."""
        revoked = (await conn.execute(sa.select(principals.c.execution_revoked_at)
                                      .where(principals.c.id == principal_id))).first()
        return revoked is not None and revoked.execution_revoked_at is None

    async def set_execution_revoked(self, conn: Connection, principal_id: str, at: datetime | None) -> None:
        """Revoke (a time) or restore (None) a principal's execution access."""
        await conn.execute(principals.update().where(principals.c.id == principal_id)
                           .values(execution_revoked_at=at))

    async def creator_name(self, conn: Connection, principal_id: str | None) -> str | None:
        """Return the name of a schedule's creator principal (None when it has none)."""
        if principal_id is None:
            return None
        return (await conn.execute(sa.select(principals.c.name).where(principals.c.id == principal_id))).scalar()

    # ------------------------------------------------------------ identity facts the policy and attribution read

    async def active_bindings(self, conn: Connection, principal_id: str) -> list[Binding]:
        """Return the principal's identity bindings that are active now, in every application, oldest id first."""
        rows = (await conn.execute(sa.select(identity_bindings.c.id, identity_bindings.c.principal_id,
                                             identity_bindings.c.app_id, identity_bindings.c.status)
                                   .where(identity_bindings.c.principal_id == principal_id,
                                          identity_bindings.c.status == BindingStatus.ACTIVE)
                                   .order_by(identity_bindings.c.id))).all()
        return [Binding(r.id, r.principal_id, r.app_id, r.status) for r in rows]

    async def binding(self, conn: Connection, binding_id: str) -> Binding | None:
        """Return one identity binding whatever its status, or None."""
        r = (await conn.execute(sa.select(identity_bindings.c.id, identity_bindings.c.principal_id,
                                          identity_bindings.c.app_id, identity_bindings.c.status)
                                .where(identity_bindings.c.id == binding_id))).first()
        return Binding(r.id, r.principal_id, r.app_id, r.status) if r is not None else None

    async def active_binding_of(self, conn: Connection, app_id: str, open_id: str) -> Binding | None:
        """Return the active binding of a Feishu user (application + open_id), or None when revoked or unknown."""
        r = (await conn.execute(sa.select(identity_bindings.c.id, identity_bindings.c.principal_id,
                                          identity_bindings.c.app_id, identity_bindings.c.status)
                                .where(identity_bindings.c.app_id == app_id, identity_bindings.c.open_id == open_id,
                                       identity_bindings.c.status == BindingStatus.ACTIVE))).first()
        return Binding(r.id, r.principal_id, r.app_id, r.status) if r is not None else None

    async def turn_receipt(self, conn: Connection, turn_id: str) -> dict[str, Any]:
        """Return the receipt frozen in a Turn's snapshot when it was admitted ({} when it has none)."""
        snap = (await conn.execute(sa.select(task_runs.c.snapshot).where(task_runs.c.id == turn_id))).scalar() or {}
        return snap.get("receipt") or {}

    async def app_timezone(self, conn: Connection, app_id: str) -> str | None:
        """Return the timezone recorded for a Feishu application (None when the hub does not know it)."""
        return (await conn.execute(sa.select(feishu_apps.c.timezone).where(feishu_apps.c.app_id == app_id))).scalar()

    # ------------------------------------------------------------ what the personal views show

    async def task_result_text(self, conn: Connection, task_id: str) -> str | None:
        """Return the result text of the Task a firing admitted (None while it has none)."""
        return (await conn.execute(sa.select(task_runs.c.result_text).where(task_runs.c.id == task_id))).scalar()

    async def active_incident_count(self, conn: Connection, app_id: str) -> int:
        """Return how many incidents of an application are active (the administrator's overview line)."""
        stmt = sa.select(sa.func.count()).select_from(incidents).where(
            incidents.c.app_id == app_id, incidents.c.active_key.is_not(None))
        return int((await conn.execute(stmt)).scalar() or 0)
