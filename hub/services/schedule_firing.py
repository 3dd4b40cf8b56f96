"""The durable firing loop and the reconciler.

Fire: claim due schedules (`FOR UPDATE SKIP LOCKED` on PostgreSQL; SQLite is single-process) → in ONE
transaction insert the firing rows and advance the rules → commit → dispatch (admit a Task / submit a
Turn) → record admission and correlation. A firing whose dispatch result was never recorded (the hub
died after the commit) is marked `unknown` by the reconciler after `unknown_after_s`; it is never replayed.
"""
from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, Callable

import sqlalchemy as sa

from ..clock import Clock, utc
from ..config import SchedulesSettings
from ..domain import schedule_rules as rules
from ..domain.tasks import OUTCOMES as TASK_OUTCOMES, Status
from ..errors import AmuxError
from ..ids import new_id
from ..store.db import Database
from ..store.tables import firings, principals, runtimes, schedules, task_runs
from .admission import Admission
from .auth import Caller
from .schedule_ports import FiringOutcome, NullOutcomeSink, OutcomeSink, SessionPort
from .schedules import submit_request

log = logging.getLogger(__name__)
# Test-only: exit the process right after a firing is committed, before it is dispatched (crash-safety tests).
CRASH_ENV = "AMUX_TEST_CRASH_AFTER_FIRING_COMMIT"


@lru_cache(maxsize=4096)
def _rule(text: str, tz: str) -> rules.Rule:
    return rules.parse(text, tz)


ADMIT_ATTEMPTS = 4  # tries of a batch's admission reads before the round fails (0.2 + 0.4 + 0.8 s between)


@dataclass
class Due:
    """A firing committed and waiting for dispatch."""

    firing_id: str
    schedule: Any
    nominal: datetime
    result: tuple[str, str | None, str | None] | None = None  # (admission, task_id, turn_id)
    task_row: dict | None = None


def _locked(db: Database, stmt: sa.Select, table: sa.Table) -> sa.Select:
    """Row-lock only `table`'s rows on PostgreSQL, skipping rows another replica holds."""
    return stmt if db.is_sqlite else stmt.with_for_update(skip_locked=True, of=table)


def _reason(e: BaseException) -> str:
    text = e.message if isinstance(e, AmuxError) else f"{type(e).__name__}: {e}"
    return ("error:" + text)[:500]


class ScheduleFiring:
    """Fire due schedules durably and reconcile outcomes onto the ledger."""

    def __init__(self, db: Database, clock: Clock, settings: SchedulesSettings, admission: Admission,
                 sessions: SessionPort | None = None, sink: OutcomeSink | None = None,
                 on_admitted: Callable[[], None] | None = None, crash_after_commit: bool | None = None) -> None:
        self.db = db
        self.clock = clock
        self.settings = settings
        self.admission = admission
        self.sessions = sessions
        self.sink = sink or NullOutcomeSink()
        self.on_admitted = on_admitted or (lambda: None)
        self.crash_after_commit = os.environ.get(CRASH_ENV) == "1" if crash_after_commit is None else crash_after_commit
        self.kicked = asyncio.Event()
        self.fired = 0

    def kick(self) -> None:
        """Ask the firing loop to look for due schedules now (a definition changed)."""
        self.kicked.set()

    # ------------------------------------------------------------ claim

    async def fire_due(self) -> int:
        """Claim due schedules, persist their firings and advance their rules, then dispatch; return claims."""
        now = self.clock.now()
        events: list[FiringOutcome] = []
        due: list[Due] = []
        async with self.db.write() as conn:
            stmt = (sa.select(schedules).where(schedules.c.next_fire_at <= now, schedules.c.paused.is_(False),
                                               schedules.c.deleted_at.is_(None))
                    .order_by(schedules.c.next_fire_at).limit(self.settings.claim_batch))
            rows = (await conn.execute(_locked(self.db, stmt, schedules))).all()
            if not rows:
                return 0
            new_firings, advances = [], []
            for row in rows:
                p = self._plan(row, now)
                if p.missed_count:
                    events.append(await self._record_missed(conn, row, p, now))
                if p.dispatch is not None:
                    d = Due(new_id("fir"), row, p.dispatch)
                    due.append(d)
                    new_firings.append({"id": d.firing_id, "schedule_id": row.id, "nominal_time": p.dispatch,
                                        "fired_at": now, "missed_count": 0, "legacy": False})
                advances.append({"sid": row.id, "nxt": p.next_fire_at})
            if new_firings:
                await conn.execute(firings.insert(), new_firings)
            await conn.execute(schedules.update().where(schedules.c.id == sa.bindparam("sid"))
                               .values(next_fire_at=sa.bindparam("nxt")), advances)
        if due and self.crash_after_commit:
            os._exit(9)  # test-only: the firing is committed, its dispatch never happens
        await self._publish(events)
        if due:
            await self._dispatch(due, now)
        self.fired += len(due)
        return len(rows)

    def _plan(self, row: Any, now: datetime) -> rules.FirePlan:
        try:
            rule = _rule(row.rule, row.timezone)
        except AmuxError:  # a zone removed from tzdata: stop the schedule rather than spin on it
            return rules.FirePlan(utc(row.next_fire_at), None, 0, None)
        return rules.plan(rule, utc(row.next_fire_at), now, self.settings.misfire_grace_s, utc(row.created_at))

    async def _record_missed(self, conn, row: Any, p: rules.FirePlan, now: datetime) -> FiringOutcome:  # noqa: ANN001
        """Collapse consecutive misses into one row with a count (extend the latest row when it is a miss)."""
        last = (await conn.execute(sa.select(firings.c.id, firings.c.nominal_time, firings.c.admission, firings.c.missed_count)
                                   .where(firings.c.schedule_id == row.id)
                                   .order_by(firings.c.nominal_time.desc()).limit(1))).first()
        if last is not None and last.admission == "missed":
            fid, nominal, count = last.id, utc(last.nominal_time), last.missed_count + p.missed_count
            await conn.execute(firings.update().where(firings.c.id == fid).values(missed_count=count, reconciled_at=now))
        else:
            fid, nominal, count = new_id("fir"), p.missed_from, p.missed_count
            await conn.execute(firings.insert().values(
                id=fid, schedule_id=row.id, nominal_time=nominal, fired_at=now, admission="missed", outcome="missed",
                missed_count=count, reconciled_at=now, legacy=False))
        return self._event(row, fid, nominal, "missed", "missed", missed_count=count)

    # ------------------------------------------------------------ dispatch

    async def _callers(self, rows: list[Any]) -> dict[str, Caller]:
        ids = {r.creator_id for r in rows if r.creator_id}
        if not ids:
            return {}
        async with self.db.read() as conn:
            names = dict((await conn.execute(sa.select(principals.c.id, principals.c.name)
                                             .where(principals.c.id.in_(ids)))).all())
        out = {}
        for r in rows:
            if r.creator_id in names:
                prov = r.provenance or {}
                out[r.id] = Caller(r.creator_id, names[r.creator_id], prov.get("token_id") or "", prov.get("label"), False)
        return out

    async def _dispatch(self, due: list[Due], now: datetime) -> None:
        callers = await self._callers([d.schedule for d in due])
        # Admission again from the start on a database error (a restart): never an admission status. Reads only,
        # so a read connection (not the SQLite writer lock); unrecorded after the last try, the firings turn unknown.
        for attempt in range(ADMIT_ATTEMPTS):
            try:
                async with self.db.read() as conn:
                    await self._admit_all(conn, due, callers, now)
                break
            except sa.exc.SQLAlchemyError:
                if attempt + 1 == ADMIT_ATTEMPTS:
                    raise
                await asyncio.sleep(0.2 * 2 ** attempt)
        for d in due:
            if d.result is None and d.schedule.type == "session-prompt":
                await self._submit_turn(d, callers[d.schedule.id])
        await self._record(due, now)

    async def _admit_all(self, conn, due: list[Due], callers: dict[str, Caller], now: datetime) -> None:  # noqa: ANN001
        """Admit each subtask firing on `conn`; fresh on each attempt (the transaction may be run again)."""
        online = (await conn.execute(sa.select(runtimes.c.name, runtimes.c.capabilities)
                                     .where(runtimes.c.status == "online"))).all()
        for d in due:
            d.result, d.task_row = None, None
            caller = callers.get(d.schedule.id)
            if caller is None:
                d.result = ("error:the schedule has no attributable creator; recreate it", None, None)
            elif d.schedule.type == "subtask":
                await self._admit(conn, d, caller, online, now)

    async def _admit(self, conn, d: Due, caller: Caller, online: list[Any], now: datetime) -> None:  # noqa: ANN001
        """Resolve the content and omitted defaults again now, like a Task submission with origin "schedule"."""
        req = submit_request(d.schedule)
        try:
            snap = await self.admission.freeze(conn, caller, req, origin="schedule")
        except sa.exc.SQLAlchemyError:
            raise  # the database, not the schedule: admission runs again (`_dispatch`)
        except Exception as e:  # noqa: BLE001 — every refusal is an admission status, never a crash
            d.result = (_reason(e), None, None)
            return
        ok = [r for r in online if snap["engine"] in (r.capabilities or {}).get("engines", [])
              and (snap["runtime"] is None or r.name == snap["runtime"])]
        if not ok:
            d.result = ("skipped:offline", None, None)
            return
        task_id = new_id("tr")
        d.result = ("ok", task_id, None)
        d.task_row = {"id": task_id, "owner_id": caller.principal_id, "name": req.name, "prompt": req.prompt,
                      "snapshot": snap, "status": Status.QUEUED.value, "attempt": 0, "event_seq": 0,
                      "last_rseq": 0, "created_at": now}

    async def _submit_turn(self, d: Due, caller: Caller) -> None:
        if self.sessions is None:
            d.result = ("error:Sessions are not available on this hub", None, None)
            return
        try:
            turn = await self.sessions.submit_turn(caller, d.schedule.session_ref, d.schedule.prompt, source="schedule")
            d.result = ("ok", None, turn)
        except Exception as e:  # noqa: BLE001
            d.result = (_reason(e), None, None)

    async def _record(self, due: list[Due], now: datetime) -> None:
        """Insert admitted Tasks and record admission + correlation in one transaction.

        Only firings still unrecorded are written: one the reconciler already marked `unknown` gets no Task. Run
        again on a transient database error (a restart): left unrecorded, the firings would turn `unknown`.
        """
        events, admitted = await self.db.transaction(lambda conn: self._record_in(conn, due, now))
        if admitted:
            self.on_admitted()
        await self._publish(events)

    async def _record_in(self, conn, due: list[Due], now: datetime) -> tuple[list[FiringOutcome], bool]:  # noqa: ANN001
        """`_record`'s writes in the caller's transaction; fresh on each attempt (what a lost commit wrote is seen)."""
        events = []
        admitted = False
        ids = [d.firing_id for d in due]
        open_ = set((await conn.execute(_locked(self.db, sa.select(firings.c.id).where(
            firings.c.id.in_(ids), firings.c.admission.is_(None), firings.c.reconciled_at.is_(None)),
            firings))).scalars())
        live = [d for d in due if d.firing_id in open_]
        tasks = [d.task_row for d in live if d.task_row is not None]
        if tasks:
            await conn.execute(task_runs.insert(), tasks)
            admitted = True
        if live:
            await conn.execute(firings.update().where(firings.c.id == sa.bindparam("fid")).values(
                admission=sa.bindparam("adm"), task_id=sa.bindparam("tid"), turn_id=sa.bindparam("uid"),
                reconciled_at=sa.bindparam("rat")),
                [{"fid": d.firing_id, "adm": d.result[0], "tid": d.result[1], "uid": d.result[2],
                  "rat": None if d.result[0] == "ok" else now} for d in live])
        for d in live:
            if d.result[0] != "ok":
                events.append(self._event(d.schedule, d.firing_id, d.nominal, None, d.result[0]))
        return events, admitted

    # ------------------------------------------------------------ reconcile

    async def reconcile(self) -> int:
        """Copy canonical terminal outcomes onto firings; mark never-recorded dispatches `unknown`; return how many."""
        now = self.clock.now()
        events: list[FiringOutcome] = []
        cols = [firings.c.id, firings.c.nominal_time, firings.c.task_id, firings.c.turn_id, firings.c.admission,
                schedules.c.id.label("schedule_id"), schedules.c.creator_id, schedules.c.app_id, schedules.c.type,
                schedules.c.rule]
        base = sa.select(*cols).join(schedules, schedules.c.id == firings.c.schedule_id).where(firings.c.reconciled_at.is_(None))
        async with self.db.write() as conn:
            # Tasks: the Task record is the canonical outcome; a vanished Task is an unavailable observation.
            stmt = (base.add_columns(task_runs.c.status).outerjoin(task_runs, task_runs.c.id == firings.c.task_id)
                    .where(firings.c.task_id.is_not(None),
                           sa.or_(task_runs.c.status.in_(TASK_OUTCOMES), task_runs.c.id.is_(None))).limit(1000))
            for r in (await conn.execute(_locked(self.db, stmt, firings))).all():
                outcome = r.status if r.status in TASK_OUTCOMES else "unknown"
                events.append(await self._settle(conn, r, outcome, now))
            # Dispatch never recorded (the hub died between commit and dispatch): unknown, never replayed.
            cutoff = now - timedelta(seconds=self.settings.unknown_after_s)
            stmt = base.where(firings.c.admission.is_(None), firings.c.fired_at < cutoff).limit(1000)
            for r in (await conn.execute(_locked(self.db, stmt, firings))).all():
                events.append(await self._settle(conn, r, "unknown", now))
            turn_rows = [] if self.sessions is None else (await conn.execute(
                base.where(firings.c.turn_id.is_not(None)).limit(1000))).all()
        for r in turn_rows:
            try:
                outcome = await self.sessions.turn_outcome(r.turn_id)
            except Exception:  # noqa: BLE001 — an unavailable observation stays open; it never implies failure
                log.warning("turn outcome of %s unavailable", r.turn_id, exc_info=True)
                continue
            if outcome is None:
                continue
            async with self.db.write() as conn:
                res = await conn.execute(firings.update().where(firings.c.id == r.id, firings.c.reconciled_at.is_(None))
                                         .values(outcome=outcome, reconciled_at=now))
                if res.rowcount:
                    events.append(self._event(r, r.id, utc(r.nominal_time), outcome, r.admission, schedule_id=r.schedule_id))
        events = [e for e in events if e is not None]
        await self._publish(events)
        return len(events)

    async def _settle(self, conn, r: Any, outcome: str, now: datetime) -> FiringOutcome:  # noqa: ANN001
        await conn.execute(firings.update().where(firings.c.id == r.id).values(outcome=outcome, reconciled_at=now))
        return self._event(r, r.id, utc(r.nominal_time), outcome, r.admission, schedule_id=r.schedule_id)

    # ------------------------------------------------------------ events and loops

    @staticmethod
    def _event(row: Any, firing_id: str, nominal: datetime, outcome: str | None, admission: str | None, *,
               missed_count: int = 0, schedule_id: str | None = None) -> FiringOutcome:
        return FiringOutcome(
            schedule_id=schedule_id or row.id, firing_id=firing_id, nominal_time=nominal, outcome=outcome,
            admission=admission, creator_id=row.creator_id, app_id=row.app_id, schedule_type=row.type,
            one_shot=row.rule.lower().startswith("at "), missed_count=missed_count,
            task_id=getattr(row, "task_id", None), turn_id=getattr(row, "turn_id", None))

    async def _publish(self, events: list[FiringOutcome]) -> None:
        for e in events:
            try:
                await self.sink.publish(e)
            except Exception:  # noqa: BLE001 — the ledger is the truth; a lost event is logged
                log.exception("outcome sink refused the event for firing %s", e.firing_id)

    async def _sleep_s(self) -> float:
        async with self.db.read() as conn:
            nxt = (await conn.execute(sa.select(sa.func.min(schedules.c.next_fire_at)).where(
                schedules.c.paused.is_(False), schedules.c.deleted_at.is_(None)))).scalar()
        if nxt is None:
            return self.settings.poll_s
        return max(0.0, min(self.settings.poll_s, (utc(nxt) - self.clock.now()).total_seconds()))

    async def firing_step(self) -> float:
        """Fire one batch of due schedules; run again at once while the batch was full (the supervisor yields
        between batches), else sleep until the next fire time (at most `poll_s`, cut short by `kicked`)."""
        if await self.fire_due() >= self.settings.claim_batch:
            return 0.0
        return await self._sleep_s()

    async def reconciler_step(self) -> None:
        """Reconcile outcomes once; the supervisor runs it every `reconcile_s`."""
        await self.reconcile()
