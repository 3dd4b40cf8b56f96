"""The outbox: notices waiting for delivery to Feishu, their claims by workers, and what became of each.

Services hold the transaction (`conn`); every method states the rule it keeps.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Sequence

import sqlalchemy as sa

from ..domain.states import NoticeState
from .db import Connection, Database, Row
from .tables import outbox

LIVE = NoticeState.PENDING  # the one notice state a worker claims; the rest are terminal
TROUBLED = (NoticeState.UNCONFIRMED, NoticeState.DEAD)


@dataclass(frozen=True, kw_only=True)
class NoticeClaim:
    """What a worker's claim fixes on one locked notice (`slot_at` None: the notice takes no new-message slot)."""

    notice_id: str
    recipient: str
    first_attempt_at: datetime
    slot_at: datetime | None = None


@dataclass(frozen=True, kw_only=True)
class NoticeSent:
    """A notice the channel delivered as `message_id`, on attempt number `attempts`."""

    notice_id: str
    message_id: str | None
    attempts: int


class SqlOutboxStore:
    """Notices waiting for delivery, their claims by workers, and what became of each."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def add(self, conn: Connection, *, notice_id: str, app_id: str, recipient: str | None, kind: str,
                  payload: dict, timezone: str, incident_id: str | None, schedule_id: str | None,
                  due: datetime, now: datetime, turn_id: str | None = None) -> None:
        """Write one pending notice due at `due`; its id is its request uuid (the same on every attempt)."""
        await conn.execute(outbox.insert().values(
            id=notice_id, app_id=app_id, recipient=recipient, kind=kind, incident_id=incident_id,
            schedule_id=schedule_id, payload=payload, request_uuid=notice_id, timezone=timezone, state=LIVE,
            attempts=0, next_attempt_at=due, created_at=now, turn_id=turn_id))

    async def supersede_updates(self, conn: Connection, incident_id: str) -> None:
        """Supersede the incident's pending card updates no worker has claimed (only the newest one matters)."""
        await conn.execute(outbox.update().where(outbox.c.incident_id == incident_id, outbox.c.kind == "update",
                                                 outbox.c.state == LIVE, outbox.c.claimed_by.is_(None))
                           .values(state=NoticeState.SUPERSEDED))

    # ------------------------------------------------------------ claims

    async def any_due(self, conn: Connection, now: datetime) -> bool:
        """Say whether any pending notice is due at `now` (claimed or not: a cheap look before locking)."""
        return (await conn.execute(sa.select(outbox.c.id).where(outbox.c.state == LIVE,
                                                                outbox.c.next_attempt_at <= now).limit(1))).first() \
            is not None

    async def lock_due(self, conn: Connection, now: datetime, limit: int) -> list[Row]:
        """Lock up to `limit` pending notices due at `now` whose claim is free or expired, earliest due first (ties
        by id), skipping rows another replica holds."""
        stmt = (sa.select(outbox).where(outbox.c.state == LIVE, outbox.c.next_attempt_at <= now,
                                        sa.or_(outbox.c.claimed_until.is_(None), outbox.c.claimed_until < now))
                .order_by(outbox.c.next_attempt_at, outbox.c.id).limit(limit))
        return list((await conn.execute(self.db.for_update(stmt, skip_locked=True))).all())

    async def slots_since(self, conn: Connection, app_ids: Iterable[str],
                          since: datetime) -> list[tuple[str, str | None, str, datetime]]:
        """Return the new-message slots (application, recipient, notice id, when) taken after `since` in `app_ids`.

        The notice id lets a retry leave its own earlier slot out of the count: one notice holds one slot.
        """
        rows = (await conn.execute(sa.select(outbox.c.app_id, outbox.c.recipient, outbox.c.id, outbox.c.slot_at)
                                   .where(outbox.c.app_id.in_(sorted(set(app_ids))), outbox.c.slot_at > since))).all()
        return [(a, r, nid, at) for a, r, nid, at in rows]

    async def claim(self, conn: Connection, notice_id: str, *, worker: str, until: datetime, recipient: str,
                    first_attempt_at: datetime, slot_at: datetime | None) -> None:
        """Lease a locked notice to `worker` until `until`, fixing its recipient and first attempt (and the
        new-message slot it takes, when it pings)."""
        values: dict[str, Any] = {"claimed_by": worker, "claimed_until": until, "recipient": recipient,
                                  "first_attempt_at": first_attempt_at}
        if slot_at is not None:
            values["slot_at"] = slot_at
        await conn.execute(outbox.update().where(outbox.c.id == notice_id).values(**values))

    async def claim_many(self, conn: Connection, claims: Sequence[NoticeClaim], *, worker: str,
                         until: datetime) -> None:
        """Lease the locked notices of `claims` to `worker` until `until` in one statement, fixing each one's
        recipient and first attempt (and the new-message slot of those that ping; the others keep theirs)."""
        if not claims:
            return
        stmt = outbox.update().where(outbox.c.id == sa.bindparam("c_id")).values(
            claimed_by=worker, claimed_until=until, recipient=sa.bindparam("c_recipient"),
            first_attempt_at=sa.bindparam("c_first"),
            slot_at=sa.func.coalesce(sa.bindparam("c_slot", type_=outbox.c.slot_at.type), outbox.c.slot_at))
        await conn.execute(stmt, [{"c_id": c.notice_id, "c_recipient": c.recipient, "c_first": c.first_attempt_at,
                                   "c_slot": c.slot_at} for c in claims])

    async def defer(self, conn: Connection, notice_id: str, until: datetime) -> None:
        """Make a notice due again at `until` (quiet hours)."""
        await conn.execute(outbox.update().where(outbox.c.id == notice_id).values(next_attempt_at=until))

    async def retire(self, conn: Connection, notice_id: str) -> None:
        """End a notice unsent: its recipient is no longer the administrator."""
        await conn.execute(outbox.update().where(outbox.c.id == notice_id).values(state=NoticeState.RETIRED))

    async def fold(self, conn: Connection, notice_id: str, digest_id: str) -> None:
        """End a notice as an item of digest `digest_id` (rate limit)."""
        await conn.execute(outbox.update().where(outbox.c.id == notice_id)
                           .values(state=NoticeState.FOLDED, digest_id=digest_id))

    async def hold(self, conn: Connection, notice_id: str, until: datetime, reason: str) -> None:
        """Keep a notice pending until `until` with `reason` as its last error (never dropped while held)."""
        await conn.execute(outbox.update().where(outbox.c.id == notice_id)
                           .values(next_attempt_at=until, last_error=reason))

    async def open_digest(self, conn: Connection, app_id: str, recipient: str) -> Row | None:
        """Return the recipient's pending digest that was never attempted (`id`, `payload`), if any."""
        return (await conn.execute(sa.select(outbox.c.id, outbox.c.payload).where(
            outbox.c.app_id == app_id, outbox.c.recipient == recipient, outbox.c.kind == "digest",
            outbox.c.state == LIVE, outbox.c.first_attempt_at.is_(None)).limit(1))).first()

    async def set_payload(self, conn: Connection, notice_id: str, payload: dict) -> None:
        """Replace a notice's view model (a digest that gained an item)."""
        await conn.execute(outbox.update().where(outbox.c.id == notice_id).values(payload=payload))

    # ------------------------------------------------------------ results (only the claim's holder records)

    async def release(self, conn: Connection, notice_id: str, worker: str, when: datetime) -> None:
        """Give back `worker`'s claim unattempted, due again at `when` and without its slot."""
        await conn.execute(outbox.update().where(outbox.c.id == notice_id, outbox.c.claimed_by == worker)
                           .values(claimed_by=None, claimed_until=None, next_attempt_at=when, slot_at=None))

    async def finish(self, conn: Connection, notice_id: str, worker: str, state: str) -> None:
        """End `worker`'s claimed notice in `state` without sending it."""
        await conn.execute(outbox.update().where(outbox.c.id == notice_id, outbox.c.claimed_by == worker)
                           .values(state=state, claimed_by=None, claimed_until=None))

    async def record_sent(self, conn: Connection, notice_id: str, worker: str, *, message_id: str | None,
                          attempts: int, now: datetime) -> bool:
        """Mark the notice sent as `message_id`, only while `worker` still holds its claim and it is pending;
        say whether it did (a late answer to an expired claim changes nothing)."""
        res = await conn.execute(outbox.update().where(*self._held(notice_id, worker)).values(
            state=NoticeState.SENT, message_id=message_id, sent_at=now, attempts=attempts, claimed_by=None,
            claimed_until=None, last_error=None))
        return bool(res.rowcount)

    async def lock_held(self, conn: Connection, notice_ids: Iterable[str], worker: str) -> set[str]:
        """Return which of `notice_ids` `worker` still holds pending, locked until the transaction ends (in id
        order); a notice whose claim expired and was taken over is absent, so its late result is not recorded."""
        ids = sorted(set(notice_ids))
        if not ids:
            return set()
        stmt = sa.select(outbox.c.id).where(outbox.c.id.in_(ids), outbox.c.claimed_by == worker,
                                            outbox.c.state == LIVE).order_by(outbox.c.id)
        return set((await conn.execute(self.db.for_update(stmt))).scalars())

    async def record_sent_round(self, conn: Connection, worker: str, sent: Sequence[NoticeSent],
                                now: datetime) -> set[str]:
        """Mark a round's delivered notices sent in one statement, only those `worker` still holds pending (a late
        answer to an expired claim changes nothing); return the ids it marked."""
        held = await self.lock_held(conn, (s.notice_id for s in sent), worker)
        marked = [s for s in sent if s.notice_id in held]
        rows = [{"s_id": s.notice_id, "s_mid": s.message_id, "s_attempts": s.attempts} for s in marked]
        if rows:
            stmt = outbox.update().where(outbox.c.id == sa.bindparam("s_id"), outbox.c.claimed_by == worker,
                                         outbox.c.state == LIVE).values(
                state=NoticeState.SENT, message_id=sa.bindparam("s_mid"), sent_at=now,
                attempts=sa.bindparam("s_attempts"),
                claimed_by=None, claimed_until=None, last_error=None)
            await conn.execute(stmt, rows)
        return {s.notice_id for s in marked}

    async def record_failure(self, conn: Connection, notice_id: str, worker: str, *, state: str, attempts: int,
                             error: str, next_attempt_at: datetime | None, new_window: bool = False) -> bool:
        """Record a failed attempt (state, attempts, error up to 2000 characters, next due time), only while
        `worker` still holds the claim; `new_window` forgets the first attempt and slot (nothing was delivered,
        so the next attempt starts a fresh dedup window). Say whether it did."""
        values: dict[str, Any] = {"state": state, "attempts": attempts, "claimed_by": None, "claimed_until": None,
                                  "last_error": error[:2000]}
        if next_attempt_at is not None:
            values["next_attempt_at"] = next_attempt_at
        if new_window:
            values.update(first_attempt_at=None, slot_at=None)
        res = await conn.execute(outbox.update().where(*self._held(notice_id, worker)).values(**values))
        return bool(res.rowcount)

    @staticmethod
    def _held(notice_id: str, worker: str) -> tuple[sa.ColumnElement[bool], ...]:
        return outbox.c.id == notice_id, outbox.c.claimed_by == worker, outbox.c.state == LIVE

    # ------------------------------------------------------------ per application and incident

    async def make_held_due(self, conn: Connection, app_id: str, now: datetime) -> int:
        """Make the application's pending notices nobody claimed due at `now`, clearing their errors; return how
        many."""
        res = await conn.execute(outbox.update().where(outbox.c.app_id == app_id, outbox.c.state == LIVE,
                                                       outbox.c.claimed_by.is_(None))
                                 .values(next_attempt_at=now, last_error=None))
        return int(res.rowcount)

    async def live_of_app(self, conn: Connection, app_id: str) -> list[Row]:
        """Return the application's pending notices, claimed ones too."""
        return list((await conn.execute(sa.select(outbox).where(outbox.c.app_id == app_id,
                                                                outbox.c.state == LIVE))).all())

    async def retire_live_of_app(self, conn: Connection, app_id: str) -> None:
        """Retire every pending notice of the application, dropping their claims (the recipient changed)."""
        await conn.execute(outbox.update().where(outbox.c.app_id == app_id, outbox.c.state == LIVE)
                           .values(state=NoticeState.RETIRED, claimed_by=None, claimed_until=None))

    async def live_of_route(self, conn: Connection, app_id: str, incident_id: str, schedule_id: str) -> list[Row]:
        """Return the pending notices (claimed ones too) that `app_id` holds for one incident and for its schedule's
        receipts: what a move of the schedule's notice route to another application retires."""
        return list((await conn.execute(sa.select(outbox).where(
            outbox.c.app_id == app_id, outbox.c.state == LIVE,
            sa.or_(outbox.c.incident_id == incident_id,
                   sa.and_(outbox.c.incident_id.is_(None), outbox.c.schedule_id == schedule_id,
                           outbox.c.kind == "receipt"))))).all())

    async def retire_many(self, conn: Connection, notice_ids: Sequence[str]) -> None:
        """Retire these pending notices, dropping their claims (their recipient changed)."""
        if notice_ids:
            await conn.execute(outbox.update().where(outbox.c.id.in_(list(notice_ids)), outbox.c.state == LIVE)
                               .values(state=NoticeState.RETIRED, claimed_by=None, claimed_until=None))

    async def of_incident(self, conn: Connection, incident_id: str) -> list[Row]:
        """Return the incident's notices (`id`, `kind`, `state`, `last_error`, `message_id`), oldest first."""
        return list((await conn.execute(sa.select(outbox.c.id, outbox.c.kind, outbox.c.state, outbox.c.last_error,
                                                  outbox.c.message_id).where(outbox.c.incident_id == incident_id)
                                        .order_by(outbox.c.created_at))).all())

    async def card_pending(self, conn: Connection, incident_id: str) -> bool:
        """Say whether the incident's card notice is still pending (its message id is not known yet)."""
        return bool((await conn.execute(sa.select(sa.func.count()).select_from(outbox).where(
            outbox.c.incident_id == incident_id, outbox.c.kind == "card", outbox.c.state == LIVE))).scalar())

    async def troubled(self, conn: Connection, limit: int = 100) -> list[Row]:
        """Return up to `limit` notices that ended unconfirmed or dead (`id`, `app_id`, `kind`, `state`,
        `last_error`)."""
        return list((await conn.execute(sa.select(outbox.c.id, outbox.c.app_id, outbox.c.kind, outbox.c.state,
                                                  outbox.c.last_error)
                                        .where(outbox.c.state.in_(TROUBLED)).limit(limit))).all())

    async def was_sent_to(self, conn: Connection, incident_id: str, app_id: str, recipient: str) -> bool:
        """Say whether any notice of the incident in `app_id` was addressed to `recipient`."""
        return (await conn.execute(sa.select(outbox.c.id).where(
            outbox.c.incident_id == incident_id, outbox.c.app_id == app_id,
            outbox.c.recipient == recipient).limit(1))).first() is not None
