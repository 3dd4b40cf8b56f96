"""The alert pipeline: firing outcomes → incident rules → notices in the outbox → the outbox worker.

Implements the schedules' OutcomeSink. `publish` runs after the firing's commit, so a crash can lose a
call: the loop also catches up from the `firings` ledger, keyed by firing id (and a collapsed missed
row's count), so each outcome is decided exactly once — the decision row's unique `ingest_key` is
written in the same transaction as the incident change and its notices.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Callable

from ...clock import Clock, iso, utc
from ...config import AlertSettings, FeishuSettings
from ...domain import alerts as rules
from ...domain.durations import duration_text
from ...domain.states import DeliveryState
from ...errors import Invalid, NotFound
from ...ids import new_id
from ...store.db import Connection, Database, Row
from ...store.incidents import DecidedElsewhere
from ..auth.service import Caller
from .channel import Channel, NullChannel
from ..schedules.notices import route
from .outbox import OutboxWorker, diagnostic_missing_admin
from ..schedules.ports import FiringOutcome

if TYPE_CHECKING:
    from ..schedules.service import ScheduleService

log = logging.getLogger(__name__)
INCIDENT_FIELDS = [f for f in rules.Incident.__dataclass_fields__]


def _incident(row: Row) -> rules.Incident:
    return rules.Incident(**{f: (utc(getattr(row, f)) if isinstance(getattr(row, f), datetime) else getattr(row, f))
                             for f in INCIDENT_FIELDS})



def incident_view(inc: rules.Incident, incident_id: str | None, sched: Row, creator: str | None, app_id: str,
                  snooze_s: float = 86400.0) -> dict:
    """Return the card view model of an incident (what the channel renders); `snooze_s` (`alerts.snooze_s`) is
    what its Snooze button holds reminders for."""
    return {"v": 1, "kind": "incident", "incident_id": incident_id, "app_id": app_id,
            "schedule_id": sched.id, "schedule_name": sched.name, "creator": creator, "timezone": sched.timezone,
            "status": inc.state, "failures": inc.failures, "missed": inc.missed, "unknowns": inc.unknowns,
            "last_outcome": inc.last_outcome, "opened_at": iso(inc.opened_at),
            "recovering_since": iso(inc.recovering_since), "closed_at": iso(inc.closed_at),
            "acknowledged": inc.acked_at is not None, "acked_at": iso(inc.acked_at), "acked_by": inc.acked_by,
            "ack_comment": inc.ack_comment, "snoozed_until": iso(inc.snoozed_until), "snooze_s": snooze_s}


@dataclass(frozen=True, kw_only=True)
class CenterPage:
    """One page of an application's active incidents, as the alert center shows them."""

    incidents: list[Row]      # incident rows with `schedule_name` and `creator_name`
    page: int                 # the page shown (clamped to the last one)
    pages: int
    delivery_state: str       # the application's (unconfigured when it is not known)
    diagnostics: list[dict]   # what blocks delivery for this application (`diagnostics()` entries of this app)


class AlertService:
    """Decide about outcomes, keep incidents, and run the outbox worker."""

    def __init__(self, db: Database, clock: Clock, settings: AlertSettings, feishu: FeishuSettings,
                 channel: Channel | None = None, schedules: ScheduleService | None = None,
                 worker_id: str | None = None) -> None:
        self.db = db
        self.clock = clock
        self.settings = settings
        self.feishu = feishu
        self.n = rules.Numbers.of(settings, feishu.dedup_window_s)
        self.channel = channel or NullChannel()
        self.schedules = schedules
        self.worker = OutboxWorker(db, clock, settings, self.n, self.channel, worker_id)
        self.notices = self.worker.notices
        self.store = self.notices.incidents
        self.outbox = self.notices.outbox
        self.kicked = asyncio.Event()
        self.synced = False
        self._closed = False

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
                # A transient database error (a PostgreSQL restart) runs the rules again instead of dropping the
                # outcome; `_ingest` reads its state afresh on each attempt.
                return await self.db.transaction(lambda conn: self._ingest(conn, ev, key))
            except DecidedElsewhere:  # another hub decided it (or opened the incident) concurrently: look again
                continue
        return None

    async def _ingest(self, conn: Connection, ev: FiringOutcome, key: str) -> str | None:
        now = self.clock.now()
        if await self.store.is_decided(conn, key):
            return None
        sched = await self.store.schedule(conn, ev.schedule_id)
        creator = await self.store.principal_name(conn, ev.creator_id) if ev.creator_id else None
        app_id = ev.app_id or (sched.app_id if sched is not None else None)
        if app_id is None and sched is not None and ev.creator_id:
            # One decision with `schedule get` (hub/services/schedules/notices.py): the creator's single linked
            # identity, else the only configured application; never a schedule recovery left unbound.
            app_id = (await route(conn, sched, [a.app_id for a in self.feishu.apps], self.store)).app_id
        missed = 0
        if ev.outcome == "missed":
            seen = await self.store.missed_counts_decided(conn, ev.firing_id)
            missed = max(1, ev.missed_count - max(seen, default=0))
        o = rules.Outcome(outcome=ev.outcome, admission=ev.admission, one_shot=ev.one_shot, missed_count=missed,
                          has_creator=ev.creator_id is not None and sched is not None, has_app=app_id is not None,
                          notify=(getattr(sched, "notify", None) or "failures") if sched is not None else "failures")
        row = await self.store.lock_active(conn, ev.schedule_id) if app_id is not None else None
        if row is not None and app_id is not None and row.app_id != app_id:
            row = await self._move(conn, row, app_id, now)
        step = rules.on_outcome(_incident(row) if row is not None else None, o, now, self.n)
        iid = row.id if row is not None else None
        changed = step.incident is not None and (row is None or step.incident != _incident(row))
        if changed and step.incident is not None and sched is not None and app_id is not None \
                and ev.creator_id is not None:
            iid = await self._save(conn, row, step.incident, sched.id, app_id, ev.creator_id, now)
        label = ev.outcome or ev.admission
        notices = await self._queue(conn, step.notices, iid, step.incident, sched, creator, app_id, now, ev=ev)
        await self.store.log(conn, decision_id=new_id("dec"), at=now, ingest_key=key, firing_id=ev.firing_id,
                             schedule_id=ev.schedule_id, incident_id=iid if step.incident is not None else None,
                             notice_id=notices[0] if notices else None, outcome=label, decision=step.decision,
                             detail=rules.DECISIONS[step.decision])
        return step.decision

    async def _save(self, conn: Connection, row: Row | None, inc: rules.Incident, schedule_id: str, app_id: str,
                    creator_id: str | None, now: datetime) -> str:
        values: dict[str, Any] = {f: getattr(inc, f) for f in INCIDENT_FIELDS}
        values["active_key"] = schedule_id if inc.state in rules.ACTIVE else None
        values["updated_at"] = now
        if row is None:
            iid = new_id("inc")
            await self.store.open(conn, incident_id=iid, schedule_id=schedule_id, app_id=app_id, creator_id=creator_id,
                                  values=values)
            return iid
        await self.store.save(conn, row.id, values)
        return row.id

    async def _queue(self, conn: Connection, kinds: tuple[str, ...], iid: str | None, inc: rules.Incident | None,
                     sched: Row | None, creator: str | None, app_id: str | None, now: datetime,
                     ev: FiringOutcome | None = None) -> list[str]:
        if not kinds or app_id is None or sched is None:  # a notice names its schedule and goes to an application
            return []
        admin = await self.store.admin_of(conn, app_id)
        out = []
        for kind in kinds:
            if kind == "receipt":
                if ev is None:  # a receipt answers one outcome
                    continue
                payload = {"v": 1, "kind": "receipt", "app_id": app_id, "schedule_id": sched.id,
                           "schedule_name": sched.name, "creator": creator, "timezone": sched.timezone,
                           "outcome": ev.outcome or ev.admission, "firing_id": ev.firing_id,
                           "nominal_time": iso(ev.nominal_time), "task_id": ev.task_id, "turn_id": ev.turn_id}
            elif inc is not None:
                payload = incident_view(inc, iid, sched, creator, app_id, self.n.snooze_s)
                payload["notice"] = kind
            else:  # an incident's notice without its incident
                continue
            out.append(await self.notices.queue(conn, now, app_id=app_id, recipient=admin, kind=kind, payload=payload,
                                                timezone=sched.timezone, incident_id=iid, schedule_id=sched.id))
        return out

    # ------------------------------------------------------------ catch-up and time

    async def catch_up(self) -> int:
        """Decide reconciled outcomes `publish` never delivered (the ledger is the truth); return how many."""
        since = self.clock.now() - timedelta(seconds=self.settings.catch_up_s)
        async with self.db.read() as conn:
            rows = await self.store.undecided_firings(conn, since, limit=500)
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
            rows = await self.store.active(conn)
        ids = [r.id for r in rows if rules.on_tick(_incident(r), now, self.n) is not None]
        changed = 0
        for iid in ids:
            async with self.db.write() as conn:
                row = await self.store.lock_if_active(conn, iid)
                if row is None:
                    continue
                step = rules.on_tick(_incident(row), now, self.n)
                if step is None:
                    continue
                await self._apply(conn, row, step, now)
                changed += 1
        return changed

    async def _apply(self, conn: Connection, row: Row, step: rules.Step, now: datetime,
                     detail: str | None = None) -> list[str]:
        sched = await self.store.schedule(conn, row.schedule_id)
        creator = await self.store.principal_name(conn, row.creator_id)
        if step.incident is not None:
            await self._save(conn, row, step.incident, row.schedule_id, row.app_id, row.creator_id, now)
        notices = await self._queue(conn, step.notices, row.id, step.incident, sched, creator, row.app_id, now)
        await self.notices.log(conn, now, step.decision, detail=detail, incident_id=row.id, schedule_id=row.schedule_id,
                               notice_id=notices[0] if notices else None)
        return notices

    # ------------------------------------------------------------ controls

    async def _control(self, incident_id: str, fn: Callable[[rules.Incident, datetime], rules.Step],
                       detail: str | None = None) -> dict:
        now = self.clock.now()
        async with self.db.write() as conn:
            row = await self.store.lock(conn, incident_id)
            if row is None:
                raise NotFound(f"incident {incident_id!r} does not exist; list incidents with `amux alerts list`")
            if row.state not in rules.ACTIVE:
                raise Invalid(f"incident {incident_id} is {row.state}; only an active incident can be changed")
            await self._apply(conn, row, fn(_incident(row), now), now, detail)
        self.kick()
        return await self.incident(incident_id)

    async def acknowledge(self, incident_id: str, by: str | None = None, comment: str | None = None) -> dict:
        """Stop reminders for an incident; its card shows who acknowledged it, when, and the comment."""
        return await self._control(incident_id, lambda inc, now: rules.acknowledge(inc, now, by, comment),
                                   f"acknowledged by {by or 'the administrator'}" + (f": {comment}" if comment else ""))

    async def snooze(self, incident_id: str, seconds: float | None = None) -> dict:
        """Hold reminders for `seconds` (default `alerts.snooze_s`)."""
        secs = self.n.snooze_s if seconds is None else seconds
        return await self._control(incident_id, lambda inc, now: rules.snooze(inc, now, self.n, secs),
                                   f"snoozed for {duration_text(secs)}")

    async def unsnooze(self, incident_id: str) -> dict:
        """Lift an incident's snooze (reminders resume; one already due is sent at the next round)."""
        def lift(inc: rules.Incident, now: datetime) -> rules.Step:
            if inc.snoozed_until is None or inc.snoozed_until <= now:
                raise Invalid(f"incident {incident_id} is not snoozed; "
                              f"snooze it with `amux alerts snooze {incident_id} --for 4h`")
            return rules.unsnooze(inc, now)

        return await self._control(incident_id, lift)

    async def pause(self, caller: Caller, incident_id: str) -> dict:
        """Pause the incident's schedule (future dispatch only; admitted Tasks keep running)."""
        inc = await self.incident(incident_id)
        if self.schedules is None:
            raise Invalid("schedules are not available on this hub")
        await self.schedules.pause(caller, inc["schedule_id"])
        async with self.db.write() as conn:
            await self.notices.log(conn, self.clock.now(), "paused", incident_id=incident_id,
                                   schedule_id=inc["schedule_id"])
        return await self.incident(incident_id)

    async def recheck(self, app_id: str) -> dict:
        """Lift a delivery suspension of `app_id` and make its held notices due now."""
        now = self.clock.now()
        async with self.db.write() as conn:
            app = await self.store.lock_app(conn, app_id)
            if app is None:
                raise NotFound(f"Feishu application {app_id!r} is not configured; add it under [[feishu.apps]]")
            state = DeliveryState.OK if app.admin_open_id else DeliveryState.UNCONFIGURED
            diag = None if app.admin_open_id else diagnostic_missing_admin(app_id, True)
            await self.store.set_delivery(conn, app_id, state, diag, now)
            pending = await self.outbox.make_held_due(conn, app_id, now)
            await self.notices.log(conn, now, "sent" if state == DeliveryState.OK else "missing_admin",
                                   detail=f"recheck of {app_id}: delivery {state}; {pending} pending notices due now")
        self.kick()
        return {"app_id": app_id, "delivery_state": state, "diagnostic": diag, "pending": pending}

    # ------------------------------------------------------------ applications and administrators

    async def sync_apps(self) -> None:
        """Upsert configured applications; an administrator change retargets delivery (see docs/alerts.md)."""
        now = self.clock.now()
        for app in self.feishu.apps:
            async with self.db.write() as conn:
                row = await self.store.lock_app(conn, app.app_id)
                admin = app.admin_open_id or None
                state = DeliveryState.OK if admin else DeliveryState.UNCONFIGURED
                diag = None if admin else diagnostic_missing_admin(app.app_id, True)
                if row is None:
                    await self.store.add_app(conn, app_id=app.app_id, admin_open_id=admin, delivery_state=state,
                                             diagnostic=diag, timezone=app.timezone, now=now)
                elif row.admin_open_id != admin:
                    await self.store.change_admin(conn, app.app_id, admin_open_id=admin, delivery_state=state,
                                                  diagnostic=diag, timezone=app.timezone, now=now)
                    await self._change_admin(conn, row, admin, now)
                else:
                    await self.store.set_timezone(conn, app.app_id, app.timezone, now)
                    if row.delivery_state == DeliveryState.UNCONFIGURED and admin:
                        await self.store.set_delivery(conn, app.app_id, DeliveryState.OK, None, now)
        self.synced = True

    async def add_local_app(self, app_id: str, admin_open_id: str, timezone: str) -> None:
        """Make an application the hub serves itself (the local console's) known to the alert center, as a
        configured one is: its delivery state, diagnostics and recheck answer for it (idempotent across replicas;
        an existing row is left as it is)."""
        async with self.db.write() as conn:
            await self.store.add_app(conn, app_id=app_id, admin_open_id=admin_open_id, delivery_state=DeliveryState.OK,
                                     diagnostic=None, timezone=timezone, now=self.clock.now())

    async def _change_admin(self, conn: Connection, app: Row, admin: str | None, now: datetime) -> None:
        """Retire the old administrator's requests and card ids; clear ack/snooze; re-notify active incidents."""
        old = await self.outbox.live_of_app(conn, app.app_id)
        await self.outbox.retire_live_of_app(conn, app.app_id)
        detail = f"administrator of {app.app_id} changed from {app.admin_open_id} to {admin}"
        for r in old:
            await self.notices.log(conn, now, "retired", detail=detail, notice_id=r.id, incident_id=r.incident_id,
                                   schedule_id=r.schedule_id)
            if r.kind == "receipt" and r.message_id is None:  # an undelivered receipt goes to the new administrator
                await self.notices.queue(conn, now, app_id=r.app_id, recipient=admin, kind="receipt", payload=r.payload,
                                         timezone=r.timezone, schedule_id=r.schedule_id)
        rows = await self.store.of_app(conn, app.app_id)
        await self.store.forget_cards_of_app(conn, app.app_id, now)
        for row in rows:
            if row.state in rules.CARDED:
                inc = rules.retarget(_incident(row))
                step = rules.Step(replace(inc, last_ping_at=now), ("card",), "opened")
                await self._apply(conn, row, step, now,
                                  detail=f"{detail}: the active incident notifies the new administrator")

    # ------------------------------------------------------------ creator delivery moving to another application

    async def follow_routes(self) -> int:
        """Move active incidents whose schedule's notice route now names another application; return how many.

        One query finds the incidents whose route can have moved (frozen elsewhere, or unfrozen with a creator now
        linked in another application); a route that now names no application leaves the incident where it is.
        """
        configured = [a.app_id for a in self.feishu.apps]
        moved: list[tuple[str, str]] = []
        async with self.db.read() as conn:
            for c in await self.store.route_candidates(conn):
                sched = await self.store.schedule(conn, c.schedule_id)
                to = (await route(conn, sched, configured, self.store)).app_id if sched is not None else None
                if to is not None and to != c.app_id:
                    moved.append((c.id, to))
        done = 0
        for iid, to in moved:
            async with self.db.write() as conn:
                row = await self.store.lock_if_active(conn, iid)
                if row is not None and row.app_id != to:
                    await self._move(conn, row, to, self.clock.now())
                    done += 1
        return done

    async def _move(self, conn: Connection, row: Row, app_id: str, now: datetime) -> Row:
        """Migrate an active incident's delivery to `app_id`: retire the old application's pending requests for it
        (undelivered receipts of its schedule are re-addressed), forget its card id, clear what was the old
        recipient's (acknowledgement, snooze), and let a carded incident send a fresh card to the new route.
        Execution state, counts, creator and the schedule's notification setting stay. Return the row as moved."""
        detail = f"notices of schedule {row.schedule_id} moved from {row.app_id} to {app_id}"
        admin = await self.store.admin_of(conn, app_id)
        for r in await self.outbox.live_of_route(conn, row.app_id, row.id, row.schedule_id):
            await self.outbox.retire_many(conn, [r.id])
            await self.notices.log(conn, now, "retired", detail=detail, notice_id=r.id, incident_id=r.incident_id,
                                   schedule_id=r.schedule_id)
            if r.kind == "receipt" and r.message_id is None:
                await self.notices.queue(conn, now, app_id=app_id, recipient=admin, kind="receipt",
                                         payload={**r.payload, "app_id": app_id}, timezone=r.timezone,
                                         schedule_id=r.schedule_id)
        await self.store.move(conn, row.id, app_id, now)
        moved = await self.store.lock(conn, row.id)
        assert moved is not None
        if moved.state in rules.CARDED:
            inc = rules.retarget(_incident(moved))
            step = rules.Step(replace(inc, last_ping_at=now), ("card",), "opened")
            await self._apply(conn, moved, step, now, detail=f"{detail}: the active incident notifies {app_id}")
            moved = await self.store.lock(conn, row.id)
            assert moved is not None
        else:
            await self.notices.log(conn, now, "retired", detail=detail, incident_id=row.id,
                                   schedule_id=row.schedule_id)
        return moved

    # ------------------------------------------------------------ reads

    async def incident(self, incident_id: str) -> dict:
        """Return one incident with its delivery state."""
        async with self.db.read() as conn:
            row = await self.store.get(conn, incident_id)
            if row is None:
                raise NotFound(f"incident {incident_id!r} does not exist; list incidents with `amux alerts list`")
            notices = await self.outbox.of_incident(conn, incident_id)
        view = {c: (iso(v) if isinstance(v, datetime) else v) for c, v in row._asdict().items()}
        view["notices"] = [n._asdict() for n in notices]
        return view

    async def card_view(self, incident_id: str) -> dict:
        """Return the current card view model of an incident (what a refreshed card in place shows)."""
        async with self.db.read() as conn:
            row = await self.store.get(conn, incident_id)
            if row is None:
                raise NotFound(f"incident {incident_id!r} does not exist; list incidents with `amux alerts list`")
            sched = await self.store.schedule(conn, row.schedule_id)
            creator = await self.store.principal_name(conn, row.creator_id)
        if sched is None:
            raise NotFound(f"the schedule of incident {incident_id!r} does not exist")
        view = incident_view(_incident(row), row.id, sched, creator, row.app_id, self.n.snooze_s)
        view["notice"] = "update"
        return view

    async def list_incidents(self, active_only: bool = True, limit: int = 100) -> list[dict]:
        """Return incidents, newest first."""
        async with self.db.read() as conn:
            rows = await self.store.newest(conn, active_only=active_only, limit=limit)
        return [{c: (iso(v) if isinstance(v, datetime) else v) for c, v in r._asdict().items()} for r in rows]

    async def explain(self, ref: str) -> dict:
        """Return the decision log for an incident (`inc_…`) or a firing (`fir_…`), oldest first."""
        async with self.db.read() as conn:
            if ref.startswith("inc_"):
                rows = await self.store.decisions_of_incident(conn, ref)
            else:
                rows = await self.store.decisions_of_firing(conn, ref)
        if not rows:
            raise NotFound(f"no decisions recorded for {ref!r}; pass an incident id (inc_…) or a firing id (fir_…) "
                           "from `amux schedule history`")
        return {"ref": ref, "decisions": [{"at": iso(r.at), "decision": r.decision, "detail": r.detail,
                                           "firing_id": r.firing_id, "incident_id": r.incident_id,
                                           "notice_id": r.notice_id, "outcome": r.outcome} for r in rows]}

    async def diagnostics(self) -> list[dict]:
        """Return delivery diagnostics: applications not ok, and unconfirmed or dead notices."""
        async with self.db.read() as conn:
            apps = await self.store.apps_not_ok(conn)
            bad = await self.outbox.troubled(conn, limit=100)
        return ([{"app_id": a.app_id, "delivery_state": a.delivery_state, "diagnostic": a.diagnostic} for a in apps]
                + [{"notice_id": b.id, "app_id": b.app_id, "kind": b.kind, "state": b.state, "diagnostic": b.last_error}
                   for b in bad])

    # ------------------------------------------------------------ the alert center (bot cards)

    async def center(self, app_id: str, page: int, page_size: int) -> CenterPage:
        """Return one page of `app_id`'s active incidents (clamped to the last page), its delivery state and
        diagnostics."""
        async with self.db.read() as conn:
            total = await self.store.count_active_in_app(conn, app_id)
            pages = max(1, -(-total // page_size))
            page = min(page, pages - 1)
            rows = await self.store.active_page_in_app(conn, app_id, offset=page * page_size, limit=page_size)
            app = await self.store.app(conn, app_id)
        diags = [d for d in await self.diagnostics() if d.get("app_id") == app_id]
        return CenterPage(incidents=rows, page=page, pages=pages,
                          delivery_state=app.delivery_state if app else DeliveryState.UNCONFIGURED,
                          diagnostics=diags)

    async def in_app(self, incident_id: str, app_id: str) -> bool:
        """Say whether `incident_id` exists in `app_id` (a card's incident, checked before acting on it)."""
        async with self.db.read() as conn:
            return await self.store.in_app(conn, incident_id, app_id)

    async def was_sent_to(self, incident_id: str, app_id: str, open_id: str) -> bool:
        """Say whether a notice of `incident_id` went to `open_id` (a former administrator pressing their card)."""
        async with self.db.read() as conn:
            return await self.outbox.was_sent_to(conn, incident_id, app_id, open_id)

    # ------------------------------------------------------------ loop

    async def tick(self) -> int:
        """Run one round: catch up, apply time to incidents, deliver due notices; return the work done."""
        if not self.synced:
            await self.sync_apps()
        work = await self.catch_up()
        work += await self.follow_routes()
        work += await self.advance()
        work += await self.worker.deliver_once()
        return work

    async def step(self) -> float:
        """Run one round; again at once while it found work, else after `alerts.poll_s` (cut short by `kicked`)."""
        return 0.0 if await self.tick() else self.settings.poll_s

    async def aclose(self) -> None:
        """Close the channel (once; the owner of this service calls it when the replica stops)."""
        if self._closed:
            return
        self._closed = True
        await self.channel.aclose()
