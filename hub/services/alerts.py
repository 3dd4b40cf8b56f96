"""The alert pipeline: firing outcomes → incident rules → notices in the outbox → the outbox worker.

Implements the schedules' OutcomeSink. `publish` runs after the firing's commit, so a crash can lose a
call: the loop also catches up from the `firings` ledger, keyed by firing id (and a collapsed missed
row's count), so each outcome is decided exactly once — the decision row's unique `ingest_key` is
written in the same transaction as the incident change and its notices.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from ..clock import Clock, utc
from ..config import AlertSettings, FeishuSettings
from ..domain import alerts as rules
from ..errors import Invalid, NotFound
from ..ids import new_id
from ..store.db import Database
from ..store.tables import decisions, feishu_apps, firings, incidents, outbox, principals, schedules
from .channel import Channel, NullChannel
from .notice_route import route
from .outbox import LIVE, OutboxWorker, diagnostic_missing_admin, log_decision, queue_notice
from .schedule_ports import FiringOutcome

log = logging.getLogger(__name__)
INCIDENT_FIELDS = [f for f in rules.Incident.__dataclass_fields__]


def _incident(row: Any) -> rules.Incident:
    return rules.Incident(**{f: (utc(getattr(row, f)) if isinstance(getattr(row, f), datetime) else getattr(row, f))
                             for f in INCIDENT_FIELDS})


def _iso(dt: datetime | None) -> str | None:
    dt = utc(dt)
    return dt.isoformat() if dt else None


def incident_view(inc: rules.Incident, incident_id: str, sched: Any, creator: str | None, app_id: str) -> dict:
    """Return the card view model of an incident (what the channel renders)."""
    return {"v": 1, "kind": "incident", "incident_id": incident_id, "app_id": app_id,
            "schedule_id": sched.id, "schedule_name": sched.name, "creator": creator, "timezone": sched.timezone,
            "status": inc.state, "failures": inc.failures, "missed": inc.missed, "unknowns": inc.unknowns,
            "last_outcome": inc.last_outcome, "opened_at": _iso(inc.opened_at),
            "recovering_since": _iso(inc.recovering_since), "closed_at": _iso(inc.closed_at),
            "acknowledged": inc.acked_at is not None, "snoozed_until": _iso(inc.snoozed_until)}


class AlertService:
    """Decide about outcomes, keep incidents, and run the outbox worker."""

    def __init__(self, db: Database, clock: Clock, settings: AlertSettings, feishu: FeishuSettings,
                 channel: Channel | None = None, schedules: Any = None, worker_id: str | None = None) -> None:
        self.db = db
        self.clock = clock
        self.settings = settings
        self.feishu = feishu
        self.n = rules.Numbers.of(settings, feishu.dedup_window_s)
        self.channel = channel or NullChannel()
        self.schedules = schedules
        self.worker = OutboxWorker(db, clock, settings, self.n, self.channel, worker_id)
        self.kicked = asyncio.Event()
        self.synced = False

    def kick(self) -> None:
        """Ask the loop to look at incidents and the outbox now."""
        self.kicked.set()

    # ------------------------------------------------------------ OutcomeSink

    async def publish(self, event: FiringOutcome) -> None:
        """Decide about one reconciled outcome (idempotent per firing id and missed count)."""
        await self.ingest(event)
        self.kick()

    async def ingest(self, ev: FiringOutcome) -> str | None:
        """Apply the incident rules to one outcome; return the decision (None if it was decided before)."""
        key = f"{ev.firing_id}:{ev.missed_count}"
        for _ in range(3):
            try:
                async with self.db.write() as conn:
                    return await self._ingest(conn, ev, key)
            except IntegrityError:  # another hub decided it (or opened the incident) concurrently: look again
                continue
        return None

    async def _ingest(self, conn, ev: FiringOutcome, key: str) -> str | None:  # noqa: ANN001
        now = self.clock.now()
        if (await conn.execute(sa.select(decisions.c.id).where(decisions.c.ingest_key == key))).first():
            return None
        sched = (await conn.execute(sa.select(schedules).where(schedules.c.id == ev.schedule_id))).first()
        creator = None
        if ev.creator_id:
            creator = (await conn.execute(sa.select(principals.c.name).where(principals.c.id == ev.creator_id))).scalar()
        app_id = ev.app_id or (sched.app_id if sched is not None else None)
        if app_id is None and sched is not None and ev.creator_id:
            # One decision with `schedule get` (hub/services/notice_route.py): the creator's single linked identity,
            # else the only configured application; never a schedule recovery left unbound.
            app_id = (await route(conn, sched, [a.app_id for a in self.feishu.apps])).app_id
        missed = 0
        if ev.outcome == "missed":
            seen = [int(k.rsplit(":", 1)[1]) for k in (await conn.execute(sa.select(decisions.c.ingest_key).where(
                decisions.c.firing_id == ev.firing_id, decisions.c.ingest_key.is_not(None)))).scalars()]
            missed = max(1, ev.missed_count - max(seen, default=0))
        o = rules.Outcome(ev.outcome, ev.admission, ev.one_shot, missed, has_creator=ev.creator_id is not None
                          and sched is not None, has_app=app_id is not None,
                          notify=(getattr(sched, "notify", None) or "failures") if sched is not None else "failures")
        row = None
        if app_id is not None:
            row = (await conn.execute(self.db.for_update(sa.select(incidents).where(
                incidents.c.active_key == ev.schedule_id)))).first()
        step = rules.on_outcome(_incident(row) if row is not None else None, o, now, self.n)
        iid = row.id if row is not None else None
        if o.has_creator and o.has_app and step.incident is not None and (row is None or step.incident != _incident(row)):
            iid = await self._save(conn, row, step.incident, sched, app_id, ev.creator_id, now)
        label = ev.outcome or ev.admission
        notices = await self._queue(conn, step.notices, iid, step.incident, sched, creator, app_id, now, ev=ev)
        await conn.execute(decisions.insert().values(
            id=new_id("dec"), at=now, ingest_key=key, firing_id=ev.firing_id, schedule_id=ev.schedule_id,
            incident_id=iid if step.incident is not None else None, notice_id=notices[0] if notices else None,
            outcome=label, decision=step.decision, detail=rules.DECISIONS[step.decision]))
        return step.decision

    async def _save(self, conn, row: Any, inc: rules.Incident, sched: Any, app_id: str, creator_id: str | None,  # noqa: ANN001
                    now: datetime) -> str:
        values = {f: getattr(inc, f) for f in INCIDENT_FIELDS}
        values["active_key"] = sched.id if inc.state in rules.ACTIVE else None
        values["updated_at"] = now
        if row is None:
            iid = new_id("inc")
            await conn.execute(incidents.insert().values(id=iid, schedule_id=sched.id, app_id=app_id,
                                                         creator_id=creator_id, kind="schedule", **values))
            return iid
        await conn.execute(incidents.update().where(incidents.c.id == row.id).values(**values))
        return row.id

    async def _queue(self, conn, kinds: tuple[str, ...], iid: str | None, inc: rules.Incident | None, sched: Any,  # noqa: ANN001
                     creator: str | None, app_id: str | None, now: datetime, ev: FiringOutcome | None = None) -> list[str]:
        if not kinds or app_id is None:
            return []
        admin = (await conn.execute(sa.select(feishu_apps.c.admin_open_id).where(feishu_apps.c.app_id == app_id))).scalar()
        out = []
        for kind in kinds:
            if kind == "receipt":
                payload = {"v": 1, "kind": "receipt", "app_id": app_id, "schedule_id": sched.id, "schedule_name": sched.name,
                           "creator": creator, "timezone": sched.timezone, "outcome": ev.outcome or ev.admission,
                           "firing_id": ev.firing_id, "nominal_time": _iso(ev.nominal_time), "task_id": ev.task_id,
                           "turn_id": ev.turn_id}
            else:
                payload = incident_view(inc, iid, sched, creator, app_id)
                payload["notice"] = kind
            out.append(await queue_notice(conn, now, app_id=app_id, recipient=admin, kind=kind, payload=payload,
                                          timezone=sched.timezone, incident_id=iid, schedule_id=sched.id))
        return out

    # ------------------------------------------------------------ catch-up and time

    async def catch_up(self) -> int:
        """Decide reconciled outcomes `publish` never delivered (the ledger is the truth); return how many."""
        since = self.clock.now() - timedelta(seconds=self.settings.catch_up_s)
        key = firings.c.id + sa.literal(":") + sa.cast(firings.c.missed_count, sa.String)
        stmt = (sa.select(firings, schedules.c.creator_id, schedules.c.app_id, schedules.c.type, schedules.c.rule)
                .join(schedules, schedules.c.id == firings.c.schedule_id)
                .outerjoin(decisions, decisions.c.ingest_key == key)
                .where(firings.c.reconciled_at.is_not(None), firings.c.reconciled_at >= since,
                       firings.c.legacy.is_(False), decisions.c.id.is_(None))
                .order_by(firings.c.reconciled_at).limit(500))
        async with self.db.read() as conn:
            rows = (await conn.execute(stmt)).all()
        for r in rows:
            await self.ingest(FiringOutcome(
                schedule_id=r.schedule_id, firing_id=r.id, nominal_time=utc(r.nominal_time), outcome=r.outcome,
                admission=r.admission, creator_id=r.creator_id, app_id=r.app_id, schedule_type=r.type,
                one_shot=r.rule.lower().startswith("at "), missed_count=r.missed_count, task_id=r.task_id,
                turn_id=r.turn_id))
        return len(rows)

    async def advance(self) -> int:
        """Apply time to active incidents (first card, reminder, close); return how many changed."""
        now = self.clock.now()
        async with self.db.read() as conn:
            rows = (await conn.execute(sa.select(incidents).where(incidents.c.active_key.is_not(None)))).all()
        ids = [r.id for r in rows if rules.on_tick(_incident(r), now, self.n) is not None]
        changed = 0
        for iid in ids:
            async with self.db.write() as conn:
                row = (await conn.execute(self.db.for_update(sa.select(incidents).where(
                    incidents.c.id == iid, incidents.c.active_key.is_not(None)), skip_locked=True))).first()
                if row is None:
                    continue
                step = rules.on_tick(_incident(row), now, self.n)
                if step is None:
                    continue
                await self._apply(conn, row, step, now)
                changed += 1
        return changed

    async def _apply(self, conn, row: Any, step: rules.Step, now: datetime, detail: str | None = None) -> list[str]:  # noqa: ANN001
        sched = (await conn.execute(sa.select(schedules).where(schedules.c.id == row.schedule_id))).first()
        creator = (await conn.execute(sa.select(principals.c.name).where(principals.c.id == row.creator_id))).scalar()
        await self._save(conn, row, step.incident, sched, row.app_id, row.creator_id, now)
        notices = await self._queue(conn, step.notices, row.id, step.incident, sched, creator, row.app_id, now)
        await log_decision(conn, now, step.decision, detail=detail, incident_id=row.id, schedule_id=row.schedule_id,
                           notice_id=notices[0] if notices else None)
        return notices

    # ------------------------------------------------------------ controls

    async def _control(self, incident_id: str, fn, detail: str | None = None) -> dict:  # noqa: ANN001
        now = self.clock.now()
        async with self.db.write() as conn:
            row = (await conn.execute(self.db.for_update(sa.select(incidents).where(incidents.c.id == incident_id)))).first()
            if row is None:
                raise NotFound(f"incident {incident_id!r} does not exist; list incidents with `amux alerts list`")
            if row.state not in rules.ACTIVE:
                raise Invalid(f"incident {incident_id} is {row.state}; only an active incident can be changed")
            await self._apply(conn, row, fn(_incident(row), now), now, detail)
        self.kick()
        return await self.incident(incident_id)

    async def acknowledge(self, incident_id: str, by: str | None = None) -> dict:
        """Stop reminders for an incident."""
        result = await self._control(incident_id, rules.acknowledge, f"acknowledged by {by or 'the administrator'}")
        async with self.db.write() as conn:
            await conn.execute(incidents.update().where(incidents.c.id == incident_id).values(acked_by=by))
        return result

    async def snooze(self, incident_id: str) -> dict:
        """Hold reminders for `alerts.snooze_s`."""
        return await self._control(incident_id, lambda inc, now: rules.snooze(inc, now, self.n))

    async def pause(self, caller: Any, incident_id: str) -> dict:
        """Pause the incident's schedule (future dispatch only; admitted Tasks keep running)."""
        inc = await self.incident(incident_id)
        if self.schedules is None:
            raise Invalid("schedules are not available on this hub")
        await self.schedules.pause(caller, inc["schedule_id"])
        async with self.db.write() as conn:
            await log_decision(conn, self.clock.now(), "paused", incident_id=incident_id, schedule_id=inc["schedule_id"])
        return await self.incident(incident_id)

    async def recheck(self, app_id: str) -> dict:
        """Lift a delivery suspension of `app_id` and make its held notices due now."""
        now = self.clock.now()
        async with self.db.write() as conn:
            app = (await conn.execute(self.db.for_update(sa.select(feishu_apps).where(feishu_apps.c.app_id == app_id)))).first()
            if app is None:
                raise NotFound(f"Feishu application {app_id!r} is not configured; add it under [[feishu.apps]]")
            state = "ok" if app.admin_open_id else "unconfigured"
            diag = None if app.admin_open_id else diagnostic_missing_admin(app_id, True)
            await conn.execute(feishu_apps.update().where(feishu_apps.c.app_id == app_id)
                               .values(delivery_state=state, diagnostic=diag, updated_at=now))
            res = await conn.execute(outbox.update().where(outbox.c.app_id == app_id, outbox.c.state == LIVE,
                                                           outbox.c.claimed_by.is_(None))
                                     .values(next_attempt_at=now, last_error=None))
            await log_decision(conn, now, "sent" if state == "ok" else "missing_admin",
                               detail=f"recheck of {app_id}: delivery {state}; {res.rowcount} pending notices due now")
        self.kick()
        return {"app_id": app_id, "delivery_state": state, "diagnostic": diag, "pending": res.rowcount}

    # ------------------------------------------------------------ applications and administrators

    async def sync_apps(self) -> None:
        """Upsert configured applications; an administrator change retargets delivery (see docs/alerts.md)."""
        now = self.clock.now()
        for app in self.feishu.apps:
            async with self.db.write() as conn:
                row = (await conn.execute(self.db.for_update(sa.select(feishu_apps).where(
                    feishu_apps.c.app_id == app.app_id)))).first()
                admin = app.admin_open_id or None
                state = "ok" if admin else "unconfigured"
                diag = None if admin else diagnostic_missing_admin(app.app_id, True)
                if row is None:
                    await conn.execute(feishu_apps.insert().values(
                        app_id=app.app_id, admin_open_id=admin, admin_changed_at=now, admin_epoch=0,
                        delivery_state=state, diagnostic=diag, timezone=app.timezone, updated_at=now))
                elif row.admin_open_id != admin:
                    await conn.execute(feishu_apps.update().where(feishu_apps.c.app_id == app.app_id).values(
                        admin_open_id=admin, admin_changed_at=now, admin_epoch=row.admin_epoch + 1,
                        delivery_state=state, diagnostic=diag, timezone=app.timezone, updated_at=now))
                    await self._change_admin(conn, row, admin, now)
                else:
                    values = {"timezone": app.timezone, "updated_at": now}
                    if row.delivery_state == "unconfigured" and admin:
                        values.update(delivery_state="ok", diagnostic=None)
                    await conn.execute(feishu_apps.update().where(feishu_apps.c.app_id == app.app_id).values(**values))
        self.synced = True

    async def _change_admin(self, conn, app: Any, admin: str | None, now: datetime) -> None:  # noqa: ANN001
        """Retire the old administrator's requests and card ids; clear ack/snooze; re-notify active incidents."""
        old = (await conn.execute(sa.select(outbox).where(outbox.c.app_id == app.app_id, outbox.c.state == LIVE))).all()
        await conn.execute(outbox.update().where(outbox.c.app_id == app.app_id, outbox.c.state == LIVE)
                           .values(state="retired", claimed_by=None, claimed_until=None))
        detail = f"administrator of {app.app_id} changed from {app.admin_open_id} to {admin}"
        for r in old:
            await log_decision(conn, now, "retired", detail=detail, notice_id=r.id, incident_id=r.incident_id,
                               schedule_id=r.schedule_id)
            if r.kind == "receipt" and r.message_id is None:  # an undelivered receipt goes to the new administrator
                await queue_notice(conn, now, app_id=r.app_id, recipient=admin, kind="receipt", payload=r.payload,
                                   timezone=r.timezone, schedule_id=r.schedule_id)
        rows = (await conn.execute(sa.select(incidents).where(incidents.c.app_id == app.app_id))).all()
        await conn.execute(incidents.update().where(incidents.c.app_id == app.app_id).values(
            card_message_id=None, card_sent_at=None, acked_at=None, acked_by=None, snoozed_until=None, updated_at=now))
        for row in rows:
            if row.state in ("open", "recovering"):
                inc = rules.retarget(_incident(row))
                step = rules.Step(replace(inc, last_ping_at=now), ("card",), "opened")
                await self._apply(conn, row, step, now, detail=f"{detail}: the active incident notifies the new administrator")

    # ------------------------------------------------------------ reads

    async def incident(self, incident_id: str) -> dict:
        """Return one incident with its delivery state."""
        async with self.db.read() as conn:
            row = (await conn.execute(sa.select(incidents).where(incidents.c.id == incident_id))).first()
            if row is None:
                raise NotFound(f"incident {incident_id!r} does not exist; list incidents with `amux alerts list`")
            notices = (await conn.execute(sa.select(outbox.c.id, outbox.c.kind, outbox.c.state, outbox.c.last_error,
                                                    outbox.c.message_id).where(outbox.c.incident_id == incident_id)
                                          .order_by(outbox.c.created_at))).all()
        view = {c: (_iso(v) if isinstance(v, datetime) else v) for c, v in row._mapping.items()}
        view["notices"] = [dict(n._mapping) for n in notices]
        return view

    async def card_view(self, incident_id: str) -> dict:
        """Return the current card view model of an incident (what a refreshed card in place shows)."""
        async with self.db.read() as conn:
            row = (await conn.execute(sa.select(incidents).where(incidents.c.id == incident_id))).first()
            if row is None:
                raise NotFound(f"incident {incident_id!r} does not exist; list incidents with `amux alerts list`")
            sched = (await conn.execute(sa.select(schedules).where(schedules.c.id == row.schedule_id))).first()
            creator = (await conn.execute(sa.select(principals.c.name).where(principals.c.id == row.creator_id))).scalar()
        view = incident_view(_incident(row), row.id, sched, creator, row.app_id)
        view["notice"] = "update"
        return view

    async def list_incidents(self, active_only: bool = True, limit: int = 100) -> list[dict]:
        """Return incidents, newest first."""
        stmt = sa.select(incidents).order_by(incidents.c.opened_at.desc()).limit(limit)
        if active_only:
            stmt = stmt.where(incidents.c.active_key.is_not(None))
        async with self.db.read() as conn:
            rows = (await conn.execute(stmt)).all()
        return [{c: (_iso(v) if isinstance(v, datetime) else v) for c, v in r._mapping.items()} for r in rows]

    async def explain(self, ref: str) -> dict:
        """Return the decision log for an incident (`inc_…`) or a firing (`fir_…`), oldest first."""
        async with self.db.read() as conn:
            if ref.startswith("inc_"):
                where = decisions.c.incident_id == ref
            else:
                iids = [i for i in (await conn.execute(sa.select(decisions.c.incident_id).where(
                    decisions.c.firing_id == ref))).scalars() if i]
                where = sa.or_(decisions.c.firing_id == ref, decisions.c.incident_id.in_(iids)) if iids else decisions.c.firing_id == ref
            rows = (await conn.execute(sa.select(decisions).where(where).order_by(decisions.c.at, decisions.c.id))).all()
        if not rows:
            raise NotFound(f"no decisions recorded for {ref!r}; pass an incident id (inc_…) or a firing id (fir_…) "
                           "from `amux schedule history`")
        return {"ref": ref, "decisions": [{"at": _iso(r.at), "decision": r.decision, "detail": r.detail,
                                           "firing_id": r.firing_id, "incident_id": r.incident_id,
                                           "notice_id": r.notice_id, "outcome": r.outcome} for r in rows]}

    async def diagnostics(self) -> list[dict]:
        """Return delivery diagnostics: applications not ok, and unconfirmed or dead notices."""
        async with self.db.read() as conn:
            apps = (await conn.execute(sa.select(feishu_apps).where(feishu_apps.c.delivery_state != "ok"))).all()
            bad = (await conn.execute(sa.select(outbox.c.id, outbox.c.app_id, outbox.c.kind, outbox.c.state, outbox.c.last_error)
                                      .where(outbox.c.state.in_(("unconfirmed", "dead"))).limit(100))).all()
        return ([{"app_id": a.app_id, "delivery_state": a.delivery_state, "diagnostic": a.diagnostic} for a in apps]
                + [{"notice_id": b.id, "app_id": b.app_id, "kind": b.kind, "state": b.state, "diagnostic": b.last_error}
                   for b in bad])

    # ------------------------------------------------------------ loop

    async def tick(self) -> int:
        """Run one round: catch up, apply time to incidents, deliver due notices; return the work done."""
        if not self.synced:
            await self.sync_apps()
        work = await self.catch_up()
        work += await self.advance()
        work += await self.worker.deliver_once()
        return work

    async def step(self) -> float:
        """Run one round; again at once while it found work, else after `alerts.poll_s` (cut short by `kicked`)."""
        return 0.0 if await self.tick() else self.settings.poll_s

    async def aclose(self) -> None:
        """Close the channel."""
        await self.channel.aclose()
