"""The runs a runtime holds, as its runner reports on them: accepted, started, steered, finished; the sessions
it serves."""
from __future__ import annotations

from datetime import datetime
from typing import Collection

import sqlalchemy as sa

from ..domain.tasks import Status
from .db import Connection, Database, Row, among, one_of
from .registry import ON_RUNTIME
from .tables import mailbox, reservations, sessions, task_runs

# The runner reports' statements, built once: building a statement costs more than running it (bench/dispatch).
# What the reports read of the run they apply to (never its prompt or snapshot).
HELD_COLUMNS = [task_runs.c[n] for n in ("id", "owner_id", "session_id", "kind", "status", "created_at", "runtime_id",
                                          "attempt", "cancel_requested_at", "last_rseq", "event_seq", "usage_json",
                                          "error")]
_HELD = sa.select(*HELD_COLUMNS).where(task_runs.c.id == sa.bindparam("b_task_id"))
_HELD_MANY = (sa.select(*HELD_COLUMNS).where(one_of(task_runs.c.id, "b_task_ids"))
              .order_by(task_runs.c.id))  # one lock order for every batch (PostgreSQL)
_START_TASK = (task_runs.update().where(task_runs.c.id == sa.bindparam("b_task_id"))
                      .values(status=Status.RUNNING.value, started_at=sa.bindparam("b_now")))
_COMMIT_RESERVATION = (reservations.update().where(
    reservations.c.task_id == sa.bindparam("b_task_id"), reservations.c.attempt == sa.bindparam("b_attempt"),
    reservations.c.state == "pending").values(state="committed"))


class SqlReportStore:
    """What the runner protocol's reports read and write of the runs a runtime holds (`task_runs`,
    `reservations`, `mailbox`, `sessions`)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._held = db.for_update(_HELD)
        self._held_many = db.for_update(_HELD_MANY)

    async def runs_on(self, conn: Connection, runtime_id: str) -> list[Row]:
        """Return the runs dispatched to or running on the runtime: id, status, attempt."""
        return list((await conn.execute(sa.select(task_runs.c.id, task_runs.c.status, task_runs.c.attempt).where(
            task_runs.c.runtime_id == runtime_id, among(task_runs.c.status, ON_RUNTIME)))).all())

    async def placement_of(self, conn: Connection, task_id: str) -> Row | None:
        """Return where a run is placed: runtime_id, attempt, status, error; None for an unknown run."""
        return (await conn.execute(sa.select(task_runs.c.runtime_id, task_runs.c.attempt, task_runs.c.status,
                                             task_runs.c.error).where(task_runs.c.id == task_id))).first()

    async def held_run(self, conn: Connection, runtime_id: str, task_id: str, attempt: int) -> Row | None:
        """Return the run (`HELD_COLUMNS`), locked until the transaction ends, only when this runtime holds this
        attempt of it."""
        rows = list((await conn.execute(self._held, {"b_task_id": task_id})).all())
        row = rows[0] if rows else None
        if row is None or row.runtime_id != runtime_id or row.attempt != attempt:
            return None
        return row

    async def held_runs(self, conn: Connection, task_ids: Collection[str]) -> dict[str, Row]:
        """Return these runs (`HELD_COLUMNS`) by id, locked until the transaction ends, in id order; which runtime
        and attempt hold each is the caller's to check (`held_run` checks one)."""
        if not task_ids:
            return {}
        return {r.id: r for r in (await conn.execute(self._held_many, {"b_task_ids": sorted(set(task_ids))})).all()}

    async def resend_dispatch(self, conn: Connection, task_id: str) -> None:
        """Forget that the run's pending dispatch was sent, so the runtime's next connection sends it again."""
        await conn.execute(reservations.update().where(
            reservations.c.task_id == task_id, reservations.c.state == "pending").values(sent_at=None))

    async def start_run(self, conn: Connection, task_id: str, attempt: int, now: datetime) -> None:
        """Mark a dispatched run running, then commit its pending reservation of `attempt` — the task row first,
        then the reservation: the reaper takes them in this order too (the opposite deadlocked on PostgreSQL)."""
        await conn.execute(_START_TASK, {"b_task_id": task_id, "b_now": now})
        await conn.execute(_COMMIT_RESERVATION, {"b_task_id": task_id, "b_attempt": attempt})

    async def settle_steer(self, conn: Connection, steer_id: str, task_id: str, delivered: bool,
                           now: datetime, note: str | None = None) -> None:
        """Settle a pending steer: taken by the running turn `task_id`, or back to the mailbox (queued, no task,
        `note` saying why the turn could not take it) for a later wake; a steer settled already stays as it is."""
        await conn.execute(mailbox.update().where(mailbox.c.id == steer_id, mailbox.c.state == "pending")
                           .values(state="delivered" if delivered else "queued", settled_at=now,
                                   task_id=task_id if delivered else None,
                                   note=None if delivered or not note else note[:1000]))

    async def stick_session(self, conn: Connection, session_id: str, runtime_id: str) -> None:
        """Make the session's runtime the one of its first run; a session that has one keeps it."""
        await conn.execute(sessions.update().where(sessions.c.id == session_id, sessions.c.runtime_id.is_(None))
                           .values(runtime_id=runtime_id))

    async def record_resume_handle(self, conn: Connection, session_id: str, handle: str, now: datetime) -> None:
        """Store the provider's resume handle a session's run reported, for its next turn."""
        await conn.execute(sessions.update().where(sessions.c.id == session_id)
                           .values(resume_handle=handle, updated_at=now))

    async def memory_scope(self, conn: Connection, session_id: str) -> str | None:
        """Return the session's bound memory scope (None before its first launch)."""
        return (await conn.execute(sa.select(sessions.c.memory_scope).where(sessions.c.id == session_id))).scalar()

    async def bind_memory_scope(self, conn: Connection, session_id: str, scope: str | None) -> None:
        """Store the memory scope the session's first launch bound."""
        await conn.execute(sessions.update().where(sessions.c.id == session_id).values(memory_scope=scope))
