"""The alert aggregate's rows: incidents, the decision log, Feishu applications' delivery state, and the outbox.

`SqlIncidentStore` keeps incidents, decisions and `feishu_apps` (plus the reads of schedules, principals, firings,
bindings and recovery results the incident rules need); `SqlOutboxStore` keeps the notices and their claims.
Services hold the transaction (`conn`); every method states the rule it keeps.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Mapping, Sequence

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from ..domain.states import BindingStatus, DeliveryState, NoticeState
from .db import Connection, Database, Row, insert_new
from .tables import (decisions, feishu_apps, firings, identity_bindings, incidents, outbox, principals,
                     recovery_results, schedules)

LIVE = NoticeState.PENDING  # the one notice state a worker claims; the rest are terminal
TROUBLED = (NoticeState.UNCONFIRMED, NoticeState.DEAD)


@dataclass(frozen=True, kw_only=True)
class NewDecision:
    """One decision-log row written with others in one statement (no `ingest_key`: not an outcome's decision)."""

    decision_id: str
    decision: str
    detail: str | None
    notice_id: str | None = None
    incident_id: str | None = None
    schedule_id: str | None = None


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


class DecidedElsewhere(Exception):
    """Another replica decided the same outcome, or opened the same schedule's incident, at the same time."""


class SqlIncidentStore:
    """Incidents, the decision log and the Feishu applications' administrators and delivery state."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # ------------------------------------------------------------ decisions

    async def is_decided(self, conn: Connection, ingest_key: str) -> bool:
        """Say whether the outcome keyed `ingest_key` (firing id and missed count) was decided already."""
        return (await conn.execute(sa.select(decisions.c.id).where(decisions.c.ingest_key == ingest_key))).first() \
            is not None

    async def missed_counts_decided(self, conn: Connection, firing_id: str) -> list[int]:
        """Return the missed counts already decided for `firing_id` (a collapsed missed row is decided per count)."""
        keys = (await conn.execute(sa.select(decisions.c.ingest_key).where(
            decisions.c.firing_id == firing_id, decisions.c.ingest_key.is_not(None)))).scalars()
        return [int(k.rsplit(":", 1)[1]) for k in keys]

    async def log(self, conn: Connection, *, decision_id: str, at: datetime, decision: str, detail: str | None,
                  ingest_key: str | None = None, firing_id: str | None = None, schedule_id: str | None = None,
                  incident_id: str | None = None, notice_id: str | None = None, outcome: str | None = None) -> None:
        """Append one decision; a second decision with the same `ingest_key` raises DecidedElsewhere (each
        outcome is decided exactly once, on whichever replica gets there first)."""
        values = dict(id=decision_id, at=at, decision=decision, detail=detail, ingest_key=ingest_key,
                      firing_id=firing_id, schedule_id=schedule_id, incident_id=incident_id, notice_id=notice_id,
                      outcome=outcome)
        if ingest_key is None:
            await conn.execute(decisions.insert().values(**values))
            return
        # Two replicas deciding one outcome at once is expected: ON CONFLICT keeps it out of the server's error log.
        if not await insert_new(conn, decisions, values, ["ingest_key"]):
            raise DecidedElsewhere(f"outcome {ingest_key} was decided concurrently")

    async def log_many(self, conn: Connection, at: datetime, rows: Sequence[NewDecision]) -> None:
        """Append the decisions of one round at `at` in one statement (none of them keyed by an outcome)."""
        if rows:
            await conn.execute(decisions.insert(), [dict(
                id=r.decision_id, at=at, decision=r.decision, detail=r.detail, ingest_key=None, firing_id=None,
                schedule_id=r.schedule_id, incident_id=r.incident_id, notice_id=r.notice_id, outcome=None)
                for r in rows])

    async def decisions_of_incident(self, conn: Connection, incident_id: str) -> list[Row]:
        """Return the decisions about `incident_id`, oldest first."""
        return list((await conn.execute(sa.select(decisions).where(decisions.c.incident_id == incident_id)
                                        .order_by(decisions.c.at, decisions.c.id))).all())

    async def decisions_of_firing(self, conn: Connection, firing_id: str) -> list[Row]:
        """Return the decisions about `firing_id` and about every incident it touched, oldest first."""
        iids = [i for i in (await conn.execute(sa.select(decisions.c.incident_id).where(
            decisions.c.firing_id == firing_id))).scalars() if i]
        where = decisions.c.firing_id == firing_id
        if iids:
            where = sa.or_(where, decisions.c.incident_id.in_(iids))
        return list((await conn.execute(sa.select(decisions).where(where)
                                        .order_by(decisions.c.at, decisions.c.id))).all())

    async def undecided_firings(self, conn: Connection, since: datetime, limit: int = 500) -> list[Row]:
        """Return up to `limit` firings reconciled since `since` whose outcome has no decision yet (keyed by firing
        id and missed count; legacy firings excluded), oldest reconciliation first, with their schedule's creator,
        application, type and rule."""
        key = firings.c.id + sa.literal(":") + sa.cast(firings.c.missed_count, sa.String)
        stmt = (sa.select(firings, schedules.c.creator_id, schedules.c.app_id, schedules.c.type, schedules.c.rule)
                .join(schedules, schedules.c.id == firings.c.schedule_id)
                .outerjoin(decisions, decisions.c.ingest_key == key)
                .where(firings.c.reconciled_at.is_not(None), firings.c.reconciled_at >= since,
                       firings.c.legacy.is_(False), decisions.c.id.is_(None))
                .order_by(firings.c.reconciled_at).limit(limit))
        return list((await conn.execute(stmt)).all())

    # ------------------------------------------------------------ what incidents are about

    async def schedule(self, conn: Connection, schedule_id: str) -> Row | None:
        """Return the schedule an outcome or incident is about (deleted ones too: their incidents still close)."""
        return (await conn.execute(sa.select(schedules).where(schedules.c.id == schedule_id))).first()

    async def principal_name(self, conn: Connection, principal_id: str | None) -> str | None:
        """Return the name a notice attributes a schedule to (None without a creator)."""
        if principal_id is None:
            return None
        return (await conn.execute(sa.select(principals.c.name).where(principals.c.id == principal_id))).scalar()

    async def left_unbound_by_recovery(self, conn: Connection, schedule_id: str) -> bool:
        """Say whether upgrade recovery recorded that it could not prove who created `schedule_id`."""
        return (await conn.execute(sa.select(recovery_results.c.schedule_id).where(
            recovery_results.c.schedule_id == schedule_id, recovery_results.c.outcome == "unbound"))).first() \
            is not None

    async def bound_apps(self, conn: Connection, principal_id: str) -> list[str]:
        """Return the applications in which `principal_id` has an active Feishu binding, sorted, each once."""
        return sorted(set((await conn.execute(sa.select(identity_bindings.c.app_id).where(
            identity_bindings.c.principal_id == principal_id,
            identity_bindings.c.status == BindingStatus.ACTIVE))).scalars()))

    # ------------------------------------------------------------ incidents

    async def lock_active(self, conn: Connection, schedule_id: str) -> Row | None:
        """Return the schedule's active incident (at most one: `active_key`), locked until the transaction ends."""
        return (await conn.execute(self.db.for_update(sa.select(incidents).where(
            incidents.c.active_key == schedule_id)))).first()

    async def lock_if_active(self, conn: Connection, incident_id: str) -> Row | None:
        """Lock `incident_id` while it is still active; None when it closed or another replica holds it."""
        return (await conn.execute(self.db.for_update(sa.select(incidents).where(
            incidents.c.id == incident_id, incidents.c.active_key.is_not(None)), skip_locked=True))).first()

    async def lock(self, conn: Connection, incident_id: str) -> Row | None:
        """Return `incident_id` locked until the transaction ends (waiting for another replica's lock)."""
        return (await conn.execute(self.db.for_update(sa.select(incidents).where(
            incidents.c.id == incident_id)))).first()

    async def get(self, conn: Connection, incident_id: str) -> Row | None:
        """Return one incident."""
        return (await conn.execute(sa.select(incidents).where(incidents.c.id == incident_id))).first()

    async def active(self, conn: Connection) -> list[Row]:
        """Return every active incident (the ones time can still change)."""
        return list((await conn.execute(sa.select(incidents).where(incidents.c.active_key.is_not(None)))).all())

    async def newest(self, conn: Connection, *, active_only: bool, limit: int) -> list[Row]:
        """Return up to `limit` incidents, newest opened first (only active ones when `active_only`)."""
        stmt = sa.select(incidents).order_by(incidents.c.opened_at.desc()).limit(limit)
        if active_only:
            stmt = stmt.where(incidents.c.active_key.is_not(None))
        return list((await conn.execute(stmt)).all())

    async def open(self, conn: Connection, *, incident_id: str, schedule_id: str, app_id: str,
                   creator_id: str | None, values: Mapping[str, Any]) -> None:
        """Insert a new schedule incident; a second active incident of the same schedule (`active_key`) raises
        DecidedElsewhere."""
        try:
            await conn.execute(incidents.insert().values(id=incident_id, schedule_id=schedule_id, app_id=app_id,
                                                         creator_id=creator_id, kind="schedule", **values))
        except IntegrityError as e:
            raise DecidedElsewhere(f"schedule {schedule_id} got an active incident concurrently") from e

    async def save(self, conn: Connection, incident_id: str, values: Mapping[str, Any]) -> None:
        """Write the incident's rule state (`values`: its fields, `active_key` and `updated_at`)."""
        await conn.execute(incidents.update().where(incidents.c.id == incident_id).values(**values))

    async def set_acked_by(self, conn: Connection, incident_id: str, by: str | None) -> None:
        """Record who acknowledged the incident."""
        await conn.execute(incidents.update().where(incidents.c.id == incident_id).values(acked_by=by))

    async def set_card(self, conn: Connection, incident_id: str, message_id: str | None, now: datetime) -> None:
        """Remember the message that is the incident's card (later updates and reminders go to it)."""
        await conn.execute(incidents.update().where(incidents.c.id == incident_id)
                           .values(card_message_id=message_id, card_sent_at=now, updated_at=now))

    async def card(self, conn: Connection, incident_id: str) -> Row | None:
        """Return the incident's card (`card_message_id`, `card_sent_at`); None when the incident is gone."""
        return (await conn.execute(sa.select(incidents.c.card_message_id, incidents.c.card_sent_at)
                                   .where(incidents.c.id == incident_id))).first()

    async def of_app(self, conn: Connection, app_id: str) -> list[Row]:
        """Return every incident of `app_id`, closed ones too."""
        return list((await conn.execute(sa.select(incidents).where(incidents.c.app_id == app_id))).all())

    async def forget_cards_of_app(self, conn: Connection, app_id: str, now: datetime) -> None:
        """Clear the card, acknowledgement and snooze of every incident of `app_id` (they were the old
        administrator's: the new one gets fresh cards)."""
        await conn.execute(incidents.update().where(incidents.c.app_id == app_id).values(
            card_message_id=None, card_sent_at=None, acked_at=None, acked_by=None, ack_comment=None,
            snoozed_until=None, updated_at=now))

    async def route_candidates(self, conn: Connection) -> list[Row]:
        """Return the active incidents (`id`, `schedule_id`, `app_id`) whose schedule's notice route may have moved:
        its schedule is frozen to another application than the incident's, or is not frozen and its creator now
        has an active binding in another application (what `notice_route.route` follows)."""
        elsewhere = sa.exists().where(identity_bindings.c.principal_id == incidents.c.creator_id,
                                      identity_bindings.c.status == BindingStatus.ACTIVE,
                                      identity_bindings.c.app_id != incidents.c.app_id)
        return list((await conn.execute(
            sa.select(incidents.c.id, incidents.c.schedule_id, incidents.c.app_id)
            .select_from(incidents.join(schedules, schedules.c.id == incidents.c.schedule_id))
            .where(incidents.c.active_key.is_not(None),
                   sa.or_(schedules.c.app_id != incidents.c.app_id,
                          sa.and_(schedules.c.app_id.is_(None), elsewhere))))).all())

    async def move(self, conn: Connection, incident_id: str, app_id: str, now: datetime) -> None:
        """Move the incident to `app_id`, forgetting its card and what was the old recipient's (acknowledgement,
        snooze); execution state, counts and creator stay."""
        await conn.execute(incidents.update().where(incidents.c.id == incident_id).values(
            app_id=app_id, card_message_id=None, card_sent_at=None, acked_at=None, acked_by=None, ack_comment=None,
            snoozed_until=None, updated_at=now))

    async def in_app(self, conn: Connection, incident_id: str, app_id: str) -> bool:
        """Say whether `incident_id` exists and belongs to `app_id`."""
        return (await conn.execute(sa.select(incidents.c.id).where(
            incidents.c.id == incident_id, incidents.c.app_id == app_id))).first() is not None

    async def count_active_in_app(self, conn: Connection, app_id: str) -> int:
        """Count the active incidents of `app_id`."""
        return (await conn.execute(sa.select(sa.func.count()).select_from(incidents).where(
            incidents.c.app_id == app_id, incidents.c.active_key.is_not(None)))).scalar() or 0

    async def active_page_in_app(self, conn: Connection, app_id: str, *, offset: int, limit: int) -> list[Row]:
        """Return `limit` active incidents of `app_id` from `offset`, newest opened first (ties by id), each with
        `schedule_name` and `creator_name` (None when the schedule or principal is gone)."""
        return list((await conn.execute(
            sa.select(incidents, schedules.c.name.label("schedule_name"), principals.c.name.label("creator_name"))
            .outerjoin(schedules, schedules.c.id == incidents.c.schedule_id)
            .outerjoin(principals, principals.c.id == incidents.c.creator_id)
            .where(incidents.c.app_id == app_id, incidents.c.active_key.is_not(None))
            .order_by(incidents.c.opened_at.desc(), incidents.c.id).offset(offset).limit(limit))).all())

    # ------------------------------------------------------------ Feishu applications

    async def app(self, conn: Connection, app_id: str) -> Row | None:
        """Return the application's administrator and delivery state."""
        return (await conn.execute(sa.select(feishu_apps).where(feishu_apps.c.app_id == app_id))).first()

    async def lock_app(self, conn: Connection, app_id: str) -> Row | None:
        """Return the application row locked until the transaction ends."""
        return (await conn.execute(self.db.for_update(sa.select(feishu_apps).where(
            feishu_apps.c.app_id == app_id)))).first()

    async def lock_apps(self, conn: Connection, app_ids: Iterable[str]) -> dict[str, Row]:
        """Lock the application rows of `app_ids` in app_id order (they serialize rate-limit accounting between
        workers; a fixed order cannot deadlock); unknown ids are absent from the answer."""
        rows = (await conn.execute(self.db.for_update(sa.select(feishu_apps).where(
            feishu_apps.c.app_id.in_(sorted(set(app_ids)))).order_by(feishu_apps.c.app_id)))).all()
        return {a.app_id: a for a in rows}

    async def admin_of(self, conn: Connection, app_id: str) -> str | None:
        """Return the application's administrator (None: unknown application or none configured)."""
        return (await conn.execute(sa.select(feishu_apps.c.admin_open_id).where(
            feishu_apps.c.app_id == app_id))).scalar()

    async def add_app(self, conn: Connection, *, app_id: str, admin_open_id: str | None, delivery_state: str,
                      diagnostic: str | None, timezone: str, now: datetime) -> None:
        """Insert a configured application at administrator epoch 0 (a replica that inserted it first wins)."""
        await insert_new(conn, feishu_apps, dict(
            app_id=app_id, admin_open_id=admin_open_id, admin_changed_at=now, admin_epoch=0,
            delivery_state=delivery_state, diagnostic=diagnostic, timezone=timezone, updated_at=now), ["app_id"])

    async def change_admin(self, conn: Connection, app_id: str, *, admin_open_id: str | None, delivery_state: str,
                           diagnostic: str | None, timezone: str, now: datetime) -> None:
        """Set a new administrator: the epoch goes up by one and `admin_changed_at` is now."""
        await conn.execute(feishu_apps.update().where(feishu_apps.c.app_id == app_id).values(
            admin_open_id=admin_open_id, admin_changed_at=now, admin_epoch=feishu_apps.c.admin_epoch + 1,
            delivery_state=delivery_state, diagnostic=diagnostic, timezone=timezone, updated_at=now))

    async def set_timezone(self, conn: Connection, app_id: str, timezone: str, now: datetime) -> None:
        """Record the application's configured timezone."""
        await conn.execute(feishu_apps.update().where(feishu_apps.c.app_id == app_id)
                           .values(timezone=timezone, updated_at=now))

    async def set_delivery(self, conn: Connection, app_id: str, state: str, diagnostic: str | None,
                           now: datetime) -> None:
        """Set the application's delivery state (ok | unconfigured | suspended) and the diagnostic that says why."""
        await conn.execute(feishu_apps.update().where(feishu_apps.c.app_id == app_id)
                           .values(delivery_state=state, diagnostic=diagnostic, updated_at=now))

    async def apps_not_ok(self, conn: Connection) -> list[Row]:
        """Return the applications whose delivery is not ok (unconfigured or suspended)."""
        stmt = sa.select(feishu_apps).where(feishu_apps.c.delivery_state != DeliveryState.OK)
        return list((await conn.execute(stmt)).all())


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
