"""The chat flow's rows: each chat message's Turn with its progress card, and the Turn facts the card shows.

Services hold the transaction (`conn`); every method states the rule it keeps.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Collection

import sqlalchemy as sa

from .db import Connection, Database, Row, one_of
from .tables import chat_turns, mailbox, outbox, task_events, task_runs

RUNNING, DONE = "running", "done"


@dataclass(frozen=True, kw_only=True)
class NewChatTurn:
    """A chat Turn and where its card goes."""

    turn_id: str
    app_id: str
    chat_id: str
    open_id: str
    principal_id: str
    session_id: str
    reply_to: str
    card_notice_id: str
    notes: list[dict[str, Any]]


class SqlChatTurnStore:
    """Chat Turns in SQL, shared by every replica."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def add(self, conn: Connection, t: NewChatTurn, now: datetime) -> None:
        """Insert a running chat Turn, due for its first check at once."""
        await conn.execute(chat_turns.insert().values(
            turn_id=t.turn_id, app_id=t.app_id, chat_id=t.chat_id, open_id=t.open_id, principal_id=t.principal_id,
            session_id=t.session_id, reply_to=t.reply_to, card_notice_id=t.card_notice_id, state=RUNNING,
            rendered=None, notes=t.notes, updated_at=now, next_check_at=now, created_at=now))

    async def get(self, conn: Connection, turn_id: str, *, lock: bool = False) -> Row | None:
        """Return one chat Turn (locked until the transaction ends with `lock`)."""
        stmt = sa.select(chat_turns).where(chat_turns.c.turn_id == turn_id)
        return (await conn.execute(self.db.for_update(stmt) if lock else stmt)).first()

    async def running_in_chat(self, conn: Connection, app_id: str, chat_id: str, principal_id: str) -> Row | None:
        """Return the newest running chat Turn of (application, chat, person), locked (a steer targets it)."""
        stmt = (sa.select(chat_turns).where(chat_turns.c.app_id == app_id, chat_turns.c.chat_id == chat_id,
                                            chat_turns.c.principal_id == principal_id, chat_turns.c.state == RUNNING)
                .order_by(chat_turns.c.created_at.desc()).limit(1))
        return (await conn.execute(self.db.for_update(stmt))).first()

    async def lock_due(self, conn: Connection, now: datetime, limit: int) -> list[Row]:
        """Lock up to `limit` running chat Turns due for a check at `now`, earliest first, skipping rows another
        replica holds (each Turn is driven by one replica at a time)."""
        stmt = (sa.select(chat_turns).where(chat_turns.c.state == RUNNING, chat_turns.c.next_check_at <= now)
                .order_by(chat_turns.c.next_check_at, chat_turns.c.turn_id).limit(limit))
        return list((await conn.execute(self.db.for_update(stmt, skip_locked=True))).all())

    async def any_due(self, conn: Connection, now: datetime) -> bool:
        """Say whether any running chat Turn is due at `now` (a cheap look before locking)."""
        return (await conn.execute(sa.select(chat_turns.c.turn_id).where(
            chat_turns.c.state == RUNNING, chat_turns.c.next_check_at <= now).limit(1))).first() is not None

    async def save(self, conn: Connection, turn_id: str, **values: Any) -> None:
        """Write a chat Turn's fields (`state`, `rendered`, `notes`, `updated_at`, `next_check_at`)."""
        await conn.execute(chat_turns.update().where(chat_turns.c.turn_id == turn_id).values(**values))

    async def due_now(self, conn: Connection, turn_ids: Collection[str], now: datetime) -> None:
        """Make these running chat Turns due at `now` (something they show changed), in one statement."""
        if turn_ids:
            await conn.execute(chat_turns.update().where(one_of(chat_turns.c.turn_id, turn_ids),
                                                         chat_turns.c.state == RUNNING).values(next_check_at=now))

    async def running_among(self, conn: Connection, task_ids: Collection[str]) -> list[str]:
        """Return which of these task ids are running chat Turns (most tasks are not chat Turns at all)."""
        if not task_ids:
            return []
        return list((await conn.execute(sa.select(chat_turns.c.turn_id).where(
            one_of(chat_turns.c.turn_id, task_ids), chat_turns.c.state == RUNNING))).scalars())

    async def recent(self, conn: Connection, app_id: str, limit: int = 20) -> list[Row]:
        """Return the application's newest chat Turns (the console lists them)."""
        return list((await conn.execute(sa.select(chat_turns).where(chat_turns.c.app_id == app_id)
                                        .order_by(chat_turns.c.created_at.desc()).limit(limit))).all())

    async def outputs(self, conn: Connection, app_id: str, chat_id: str, principal_id: str, open_id: str,
                      limit: int) -> list[Row]:
        """Return the chat outputs of (application, chat, person) — the notices of its newest `limit` chat Turns
        and its refusals (`id`, `kind`, `turn_id`, `payload`, `created_at`) — oldest first."""
        turns = sa.select(chat_turns.c.turn_id).where(
            chat_turns.c.app_id == app_id, chat_turns.c.chat_id == chat_id,
            chat_turns.c.principal_id == principal_id).order_by(chat_turns.c.created_at.desc()).limit(limit)
        ids = list((await conn.execute(turns)).scalars())
        stmt = (sa.select(outbox.c.id, outbox.c.kind, outbox.c.turn_id, outbox.c.payload, outbox.c.created_at)
                .where(outbox.c.app_id == app_id, sa.or_(
                    outbox.c.turn_id.in_(ids) if ids else sa.false(),
                    sa.and_(outbox.c.turn_id.is_(None), outbox.c.kind == "chat_part",
                            outbox.c.recipient == open_id)))
                .order_by(outbox.c.created_at, outbox.c.id))
        return list((await conn.execute(stmt)).all())

    # ------------------------------------------------------------ what the card shows

    async def run(self, conn: Connection, turn_id: str) -> Row | None:
        """Return the Turn's run: status, error, result, times, runtime, owner, session."""
        return (await conn.execute(sa.select(
            task_runs.c.id, task_runs.c.status, task_runs.c.error, task_runs.c.result_text, task_runs.c.created_at,
            task_runs.c.started_at, task_runs.c.finished_at, task_runs.c.runtime_id, task_runs.c.owner_id,
            task_runs.c.session_id, task_runs.c.snapshot).where(task_runs.c.id == turn_id))).first()

    async def tool_events(self, conn: Connection, turn_id: str, limit: int = 200) -> list[dict[str, Any]]:
        """Return the Turn's newest `limit` tool events' redacted tool records, oldest first."""
        rows = (await conn.execute(sa.select(task_events.c.payload).where(
            task_events.c.task_id == turn_id, task_events.c.type == "tool")
            .order_by(task_events.c.seq.desc()).limit(limit))).scalars().all()
        return [dict((p or {}).get("tool") or {}) for p in reversed(rows)]

    async def card_message(self, conn: Connection, notice_id: str) -> Row | None:
        """Return the progress card notice's `state` and `message_id`."""
        return (await conn.execute(sa.select(outbox.c.state, outbox.c.message_id)
                                   .where(outbox.c.id == notice_id))).first()

    async def older_update_in_flight(self, conn: Connection, turn_id: str, notice_id: str, created_at: datetime,
                                     now: datetime) -> bool:
        """Say whether an earlier card update of the Turn is still claimed by a worker (updates go in order)."""
        return (await conn.execute(sa.select(outbox.c.id).where(
            outbox.c.turn_id == turn_id, outbox.c.kind == "chat_update", outbox.c.state == "pending",
            outbox.c.id != notice_id, outbox.c.created_at <= created_at, outbox.c.claimed_until > now)
            .limit(1))).first() is not None

    async def supersede_updates(self, conn: Connection, turn_id: str) -> None:
        """Supersede the Turn's pending card updates no worker has claimed (only the newest one matters)."""
        await conn.execute(outbox.update().where(outbox.c.turn_id == turn_id, outbox.c.kind == "chat_update",
                                                 outbox.c.state == "pending", outbox.c.claimed_by.is_(None))
                           .values(state="superseded"))

    # ------------------------------------------------------------ steering a Session's Turn

    async def add_steer(self, conn: Connection, *, message_id: str, turn_id: str, text: str, now: datetime) -> None:
        """Offer `text` to the running Turn `turn_id` (a pending steer its runner settles)."""
        await conn.execute(mailbox.insert().values(id=message_id, instance_id=None, text=text, kind="steer",
                                                   state="pending", task_id=turn_id, created_at=now))

    async def mail_state(self, conn: Connection, message_id: str) -> str | None:
        """Return a steer's state: pending | delivered | queued | unknown."""
        return (await conn.execute(sa.select(mailbox.c.state).where(mailbox.c.id == message_id))).scalar()

    async def steer_text(self, conn: Connection, message_id: str) -> str:
        """Return a steer's full text (a chat note keeps only its first 200 characters); "" when there is none."""
        return (await conn.execute(sa.select(mailbox.c.text).where(mailbox.c.id == message_id))).scalar() or ""

    async def give_up_steer(self, conn: Connection, message_id: str, now: datetime) -> bool:
        """Mark a steer still pending as unknown; False when its runner settled it first."""
        done = await conn.execute(mailbox.update().where(mailbox.c.id == message_id, mailbox.c.state == "pending")
                                  .values(state="unknown", settled_at=now))
        return done.rowcount > 0
