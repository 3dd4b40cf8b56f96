"""The alert aggregate's rows: incidents, the decision log and Feishu applications' delivery state.

`SqlIncidentStore` keeps incidents, decisions and `feishu_apps` (plus the reads of schedules, principals, firings,
bindings and recovery results the incident rules need); the notices and their claims are the outbox's
(`hub/store/outbox.py`). Services hold the transaction (`conn`); every method states the rule it keeps.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Mapping, Sequence

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from ..domain.states import BindingStatus, DeliveryState
from .db import Connection, Database, Row, insert_new
from .tables import (decisions, feishu_apps, firings, identity_bindings, incidents, principals,
                     recovery_results, schedules)


@dataclass(frozen=True, kw_only=True)
class NewDecision:
    """One decision-log row written with others in one statement (no `ingest_key`: not an outcome's decision)."""

    decision_id: str
    decision: str
    detail: str | None
    notice_id: str | None = None
    incident_id: str | None = None
    schedule_id: str | None = None


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
        `schedule_name` and `creator_name` (None when the schedule or principal is gone) and its last firing's
        `last_task_id` / `last_turn_id` (the run whose Agent Timeline the alert center links)."""
        return list((await conn.execute(
            sa.select(incidents, schedules.c.name.label("schedule_name"), principals.c.name.label("creator_name"),
                      firings.c.task_id.label("last_task_id"), firings.c.turn_id.label("last_turn_id"))
            .outerjoin(schedules, schedules.c.id == incidents.c.schedule_id)
            .outerjoin(principals, principals.c.id == incidents.c.creator_id)
            .outerjoin(firings, firings.c.id == incidents.c.last_firing_id)
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
