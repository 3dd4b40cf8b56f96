"""Persistent Agent Instances and their mailbox (queued input and steering corrections)."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Sequence

import sqlalchemy as sa

from ..domain.states import MailState
from ..domain.tasks import ACTIVE
from .db import Connection, Database
from .records import CurrentRun, InstanceRecord, Mail, OwnerRun, record
from .tables import instances, mailbox, task_runs


class SqlInstanceStore:
    """Agent Instances and their mailbox, in SQL."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def create(self, conn: Connection, *, instance_id: str, owner_id: str, name: str | None, session_id: str,
                     snapshot: dict[str, Any], now: datetime) -> None:
        """Insert an instance bound to its child session and frozen `snapshot`, with no run yet."""
        await conn.execute(instances.insert().values(id=instance_id, owner_id=owner_id, name=name,
                                                     session_id=session_id, snapshot=snapshot,
                                                     created_at=now, updated_at=now))

    async def get(self, conn: Connection, instance_id: str) -> InstanceRecord | None:
        """Return the instance, or None, its row held to the transaction's end: writers of one instance queue up."""
        stmt = sa.select(instances).where(instances.c.id == instance_id)
        return record(InstanceRecord, (await conn.execute(self.db.for_update(stmt))).mappings().first())

    async def ids_of_owner(self, conn: Connection, owner_id: str, *, archived: bool, limit: int) -> list[str]:
        """Return the ids of the owner's instances, newest first (archived ones only when `archived`)."""
        stmt = sa.select(instances.c.id).where(instances.c.owner_id == owner_id)
        if not archived:
            stmt = stmt.where(instances.c.archived_at.is_(None))
        return list((await conn.execute(stmt.order_by(instances.c.created_at.desc(), instances.c.id.desc())
                                        .limit(limit))).scalars())

    async def set_current_run(self, conn: Connection, instance_id: str, task_id: str, now: datetime) -> None:
        """Make `task_id` the instance's current run (what steer, interrupt, wait and archive act on)."""
        await conn.execute(instances.update().where(instances.c.id == instance_id)
                           .values(current_task_id=task_id, updated_at=now))

    async def archive(self, conn: Connection, instance_id: str, now: datetime) -> None:
        """Mark the instance archived at `now`; it takes no more work."""
        await conn.execute(instances.update().where(instances.c.id == instance_id).values(archived_at=now))

    async def current_run(self, conn: Connection, task_id: str | None) -> CurrentRun | None:
        """Return the status and runtime of the instance's current run `task_id`, or None when it has none."""
        if not task_id:
            return None
        row = (await conn.execute(sa.select(task_runs.c.status, task_runs.c.runtime_id)
                                  .where(task_runs.c.id == task_id))).first()
        return None if row is None else CurrentRun(row.status, row.runtime_id)

    async def unfinished_runs(self, conn: Connection, instance_id: str) -> list[OwnerRun]:
        """Return every owner TaskRun of the instance not yet terminal, oldest first.

        An instance can own several at once (a followup while one runs queues behind it in the child session);
        status, interrupt and archive account for all of them, not only the newest (`current_task_id`).
        """
        rows = (await conn.execute(sa.select(task_runs.c.id, task_runs.c.status, task_runs.c.runtime_id).where(
            task_runs.c.instance_id == instance_id, task_runs.c.status.in_([s.value for s in ACTIVE]))
            .order_by(task_runs.c.turn_seq, task_runs.c.id))).all()
        return [OwnerRun(r.id, r.status, r.runtime_id) for r in rows]

    async def queued_mail(self, conn: Connection, instance_id: str) -> list[Mail]:
        """Return the instance's queued mailbox input, oldest first: the order it goes ahead of the next prompt."""
        rows = (await conn.execute(sa.select(mailbox.c.id, mailbox.c.text).where(
            mailbox.c.instance_id == instance_id, mailbox.c.state == MailState.QUEUED)
            .order_by(mailbox.c.created_at, mailbox.c.id))).all()
        return [Mail(r.id, r.text) for r in rows]

    async def count_queued(self, conn: Connection, instance_id: str) -> int:
        """Count the instance's queued mailbox input (not yet delivered to any run)."""
        return (await conn.execute(sa.select(sa.func.count()).select_from(mailbox).where(
            mailbox.c.instance_id == instance_id, mailbox.c.state == MailState.QUEUED))).scalar() or 0

    async def deliver(self, conn: Connection, message_ids: Sequence[str], task_id: str, now: datetime) -> None:
        """Mark the messages delivered into the run `task_id` (they were prepended to its prompt)."""
        if message_ids:
            await conn.execute(mailbox.update().where(mailbox.c.id.in_(list(message_ids)))
                               .values(state=MailState.DELIVERED, task_id=task_id, settled_at=now))

    async def add_mail(self, conn: Connection, *, message_id: str, instance_id: str, text: str, kind: str,
                       state: str, now: datetime, task_id: str | None = None) -> None:
        """Insert a mailbox message; `state` queued waits for the next run, pending is offered to the running `task_id`.

        `kind` is queued (plain input) or steer; the runner settles a pending steer (delivered, or back to queued).
        """
        await conn.execute(mailbox.insert().values(id=message_id, instance_id=instance_id, text=text, kind=kind,
                                                   state=state, task_id=task_id, created_at=now))

    async def mail_state(self, conn: Connection, message_id: str) -> str | None:
        """Return the message's state (queued, pending, delivered, unknown), or None when there is no such one."""
        return (await conn.execute(sa.select(mailbox.c.state).where(mailbox.c.id == message_id))).scalar()

    async def mail_note(self, conn: Connection, message_id: str) -> str | None:
        """Return why a steer was queued rather than delivered (the runner's reason), or None."""
        return (await conn.execute(sa.select(mailbox.c.note).where(mailbox.c.id == message_id))).scalar()

    async def give_up_steer(self, conn: Connection, message_id: str, now: datetime) -> bool:
        """Mark a steer that is still pending as unknown (never queued); False when its runner settled it first."""
        done = await conn.execute(mailbox.update()
                                  .where(mailbox.c.id == message_id, mailbox.c.state == MailState.PENDING)
                                  .values(state=MailState.UNKNOWN, settled_at=now))
        return done.rowcount > 0


__all__ = ["CurrentRun", "Mail", "OwnerRun", "SqlInstanceStore"]
