"""The durable firing loop and the reconciler.

Fire: claim a batch of due schedules with one statement (`FOR UPDATE SKIP LOCKED` on PostgreSQL; SQLite is
single-process) → in ONE transaction insert the batch's firing rows and advance its rules (one executemany each)
→ commit → dispatch (resolve each Task's admission, once per distinct creator and choices in the batch / submit a
Turn) → in one transaction admit the Tasks through the admitter `task_submit` uses (`QueueAdmitter`: the queue
limit, the same rows) and record each admission and correlation. A subtask schedule's `overlap` decides a fire while
a Task an earlier fire admitted is unfinished: `allow` admits it anyway, `skip` admits nothing (`skipped:overlap`),
`replace` cancels the earlier Task through Task cancellation, then admits it. A firing whose dispatch result was
never recorded (the hub died after the commit) is marked `unknown` by the reconciler after `unknown_after_s`; it is
never replayed. `firing_workers` loops per replica claim apart exactly as replicas do.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Callable

from ...clock import Clock, utc
from ...config import SchedulesSettings
from ...domain import schedule_rules as rules
from ...domain.tasks import OUTCOMES as TASK_OUTCOMES
from ...errors import AmuxError, TooMany
from ...ids import new_id
from ...loops import Loops
from ...store.db import Connection, Database, Row, StoreError
from ...store.firings import DispatchResult, NewFiring, SqlFiringStore
from ...store.records import TaskRunRecord
from ...store.tasks import QueuedTask
from ..tasks.admission import Admission
from ..auth.service import Caller
from .ports import FiringOutcome, NullOutcomeSink, OutcomeSink, SessionPort, TaskPort
from .service import submit_request
from ..tasks.service import Admit, QueueAdmitter

log = logging.getLogger(__name__)


@lru_cache(maxsize=4096)
def _rule(text: str, tz: str) -> rules.Rule:
    return rules.parse(text, tz)


SKIPPED_OVERLAP = "skipped:overlap"  # overlap = skip while the previous Task is unfinished: admission, not an outcome
ADMIT_ATTEMPTS = 4  # tries of a batch's admission reads before the round fails (0.2 + 0.4 + 0.8 s between)


@dataclass(kw_only=True)
class Due:
    """A firing committed and waiting for dispatch."""

    firing_id: str
    schedule: Row
    nominal: datetime
    result: tuple[str, str | None, str | None] | None = None  # (admission, task_id, turn_id)
    task: QueuedTask | None = None  # admitted when the result is recorded (the queue limit may refuse it)
    exempt: bool = False  # its creator holds an admin token: no queue limit, as at `task_submit`
    replaces: tuple[str, ...] = ()  # overlap = replace: the unfinished Tasks cancelled as this one is admitted
    caller: Caller | None = None  # who the firing acts as (its creator): the replaced Tasks are cancelled as them


def _reason(e: BaseException) -> str:
    text = e.message if isinstance(e, AmuxError) else f"{type(e).__name__}: {e}"
    return ("error:" + text)[:500]


def _refused(e: TooMany) -> str:
    """The admission of a firing the queue limit refused: its code and the fix REST's 429 gives."""
    return f"error:{e.code}: {e.message}"[:500]


class ScheduleFiring:
    """Fire due schedules durably and reconcile outcomes onto the ledger."""

    def __init__(self, db: Database, clock: Clock, settings: SchedulesSettings, admission: Admission,
                 admitter: QueueAdmitter, sessions: SessionPort | None = None, sink: OutcomeSink | None = None,
                 on_admitted: Callable[[], None] | None = None, kicked: asyncio.Event | None = None,
                 tasks: TaskPort | None = None) -> None:
        self.db = db
        self.tasks = tasks  # cancels the previous Task of an `overlap = replace` schedule
        self.clock = clock
        self.settings = settings
        self.admission = admission
        self.admitter = admitter
        self.sessions = sessions
        self.sink = sink or NullOutcomeSink()
        self.on_admitted = on_admitted or (lambda: None)
        self.store = SqlFiringStore(db)
        self.kicked = kicked or asyncio.Event()  # shared with whoever may kick it before it exists (ScheduleService)
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
            rows = await self.store.claim_due(conn, now, self.settings.claim_batch)
            if not rows:
                return 0
            new_firings: list[NewFiring] = []
            advances: list[tuple[str, datetime | None]] = []
            for row in rows:
                p = self._plan(row, now)
                if p.missed_count:
                    events.append(await self._record_missed(conn, row, p, now))
                if p.dispatch is not None:
                    d = Due(firing_id=new_id("fir"), schedule=row, nominal=p.dispatch)
                    due.append(d)
                    new_firings.append(NewFiring(id=d.firing_id, schedule_id=row.id, nominal_time=p.dispatch,
                                                 fired_at=now))
                advances.append((row.id, p.next_fire_at))
            await self.store.insert(conn, new_firings)
            await self.store.advance(conn, advances)
        await self._publish(events)
        if due:
            await self._dispatch(due, now)
        self.fired += len(due)
        return len(rows)

    async def run_now(self, schedule_id: str) -> str:
        """Fire one schedule once, now (`schedule_run_now`): a manual firing ledgered before dispatch, admitted and
        recorded exactly like a rule's, its outcome reconciled and alerted alike; the rule's next fire time is not
        touched. Return the firing id. The caller checked access; the firing acts as the frozen creator."""
        now = self.clock.now()
        async with self.db.write() as conn:
            row = await self.store.schedule_for_update(conn, schedule_id)
            if row is None:
                raise AmuxError("the schedule is gone")
            last = await self.store.latest_manual(conn, row.id)  # two presses within one clock tick stay two rows
            nominal = max(now, utc(last) + timedelta(microseconds=1)) if last is not None else now
            d = Due(firing_id=new_id("fir"), schedule=row, nominal=nominal)
            await self.store.insert(conn, [NewFiring(id=d.firing_id, schedule_id=row.id, nominal_time=nominal,
                                                     fired_at=now, manual=True)])
        await self._dispatch([d], now)
        self.fired += 1
        return d.firing_id

    def _plan(self, row: Row, now: datetime) -> rules.FirePlan:
        try:
            rule = _rule(row.rule, row.timezone)
        except AmuxError:  # a zone removed from tzdata: stop the schedule rather than spin on it
            return rules.FirePlan(utc(row.next_fire_at), None, 0, None)
        return rules.plan(rule, utc(row.next_fire_at), now, self.settings.misfire_grace_s, utc(row.created_at))

    async def _record_missed(self, conn: Connection, row: Row, p: rules.FirePlan, now: datetime) -> FiringOutcome:
        """Collapse consecutive misses into one row with a count (extend the latest row when it is a miss)."""
        last = await self.store.latest(conn, row.id)
        if last is not None and last.admission == "missed":
            fid, nominal, count = last.id, utc(last.nominal_time), last.missed_count + p.missed_count
            await self.store.extend_missed(conn, fid, count, now)
        else:
            if p.missed_from is None:
                raise ValueError(f"schedule {row.id}: a plan of missed fires names no first missed time")
            fid, nominal, count = new_id("fir"), p.missed_from, p.missed_count
            await self.store.insert(conn, [NewFiring(id=fid, schedule_id=row.id, nominal_time=nominal, fired_at=now,
                                                     admission="missed", outcome="missed", missed_count=count,
                                                     reconciled_at=now)])
        return self._event(row, fid, nominal, "missed", "missed", missed_count=count)

    # ------------------------------------------------------------ dispatch

    async def _callers(self, conn: Connection, rows: list[Row]) -> tuple[dict[str, Caller], set[str]]:
        """Map each schedule whose creator still exists to the Caller its firing acts as; also return the creators
        exempt from the queue limit (holding an admin token)."""
        ids = {r.creator_id for r in rows if r.creator_id}
        if not ids:
            return {}, set()
        creators = await self.store.creators(conn, ids)
        out = {}
        for r in rows:
            if r.creator_id in creators:
                prov = r.provenance or {}
                out[r.id] = Caller(r.creator_id, creators[r.creator_id].name, prov.get("token_id") or "",
                                   prov.get("label"), False)
        return out, {pid for pid, c in creators.items() if c.holds_admin}

    async def _dispatch(self, due: list[Due], now: datetime) -> None:
        # Admission again from the start on a database error (a restart): never an admission status. Reads only,
        # so a read connection (not the SQLite writer lock); unrecorded after the last try, the firings turn unknown.
        for attempt in range(ADMIT_ATTEMPTS):
            try:
                async with self.db.read() as conn:
                    callers, exempt = await self._callers(conn, [d.schedule for d in due])
                    await self._admit_all(conn, due, callers, now, exempt)
                break
            except StoreError:
                if attempt + 1 == ADMIT_ATTEMPTS:
                    raise
                await asyncio.sleep(0.2 * 2 ** attempt)
        for d in due:
            if d.result is None and d.schedule.type == "session-prompt":
                await self._submit_turn(d, callers[d.schedule.id])
        await self._record(due, now)

    async def _admit_all(self, conn: Connection, due: list[Due], callers: dict[str, Caller], now: datetime,
                         exempt: set[str]) -> None:
        """Admit the batch's subtask firings on `conn`, each resolving its content and omitted defaults again now
        like a Task submission with origin "schedule" (resolved once per distinct creator and choices in the
        batch); fresh on each attempt (the reads may be run again)."""
        online = await self.store.online_runtimes(conn)
        busy = await self.store.unfinished_tasks(conn, [d.schedule.id for d in due if d.schedule.type == "subtask"
                                                        and d.schedule.overlap != "allow"])
        subtasks: list[tuple[Due, Caller]] = []
        for d in due:
            d.result, d.task, d.replaces = None, None, ()
            caller = callers.get(d.schedule.id)
            unfinished = tuple(busy.get(d.schedule.id, ()))
            if caller is None:
                d.result = ("error:the schedule has no attributable creator; recreate it", None, None)
            elif d.schedule.type == "subtask" and unfinished and d.schedule.overlap == "skip":
                d.result = (SKIPPED_OVERLAP, None, None)
            elif d.schedule.type == "subtask":
                d.replaces = unfinished if d.schedule.overlap == "replace" else ()
                d.caller = caller
                subtasks.append((d, caller))
        reqs = [(caller, submit_request(d.schedule)) for d, caller in subtasks]
        snaps = await self.admission.freeze_many(conn, reqs, origin="schedule")
        engines_online: dict[tuple[str, str | None], bool] = {}
        for (d, caller), (_, req), snap in zip(subtasks, reqs, snaps):
            if isinstance(snap, Exception):  # every refusal is an admission status, never a crash
                d.result = (_reason(snap), None, None)
                continue
            where = (snap["engine"], snap["runtime"])
            if where not in engines_online:
                engines_online[where] = any(snap["engine"] in (r.capabilities or {}).get("engines", [])
                                            and (snap["runtime"] is None or r.name == snap["runtime"]) for r in online)
            if not engines_online[where]:
                d.result = ("skipped:offline", None, None)
                continue
            d.task = QueuedTask(task_id=new_id("tr"), owner_id=caller.principal_id, name=req.name, prompt=req.prompt,
                                snapshot=snap, now=now)
            d.result, d.exempt = ("ok", d.task.task_id, None), caller.principal_id in exempt

    async def _replace_in(self, conn: Connection, live: list[Due], now: datetime,
                          results: dict[str, tuple[str, str | None, str | None]]) -> list[TaskRunRecord]:
        """Cancel, in the transaction that admits the new Tasks, the previous unfinished Tasks of each `overlap =
        replace` firing (the cancellation `task_cancel` uses: at once when not started, else through its runner):
        a crash leaves both done or neither, so exactly one of old and new goes on. A refused cancellation admits
        nothing for its firing (never two Tasks where one was asked for): `results` says so, and the firing's
        Task is left out. Return the Tasks it cancelled. Nothing of `live` changes (the transaction may run again)."""
        done: list[TaskRunRecord] = []
        for d in live:
            if not d.replaces or d.task is None or d.caller is None:
                continue
            if self.tasks is None:
                raise RuntimeError("Task cancellation is not wired into this hub")
            for task_id in d.replaces:
                try:
                    row, status = await self.tasks.cancel_in(conn, d.caller, task_id, now)
                except AmuxError as e:  # a refusal is this fire's admission status, never a crash
                    results[d.firing_id] = (f"error:the previous Task {task_id} could not be cancelled (overlap = "
                                            f"replace), so no new one was admitted: {e.message}"[:500], None, None)
                    break
                if status is not None:
                    done.append(row)
        return done

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
        """Admit the Tasks (the queue limit may refuse some) and record admission + correlation in one transaction.

        Only firings still unrecorded are written: one the reconciler already marked `unknown` gets no Task.
        """
        events, results, replaced = await self.db.transaction(lambda conn: self._record_in(conn, due, now))
        for row in replaced:  # committed with the new Tasks: wake their waiters and runners
            if self.tasks is not None:
                self.tasks.cancelled(row)
        for d in due:
            if d.firing_id in results:
                d.result = results[d.firing_id]
        if any(r[1] is not None for r in results.values()):
            self.on_admitted()
        await self._publish(events)

    async def _record_in(self, conn: Connection, due: list[Due], now: datetime
                         ) -> tuple[list[FiringOutcome], dict[str, tuple[str, str | None, str | None]],
                                    list[TaskRunRecord]]:
        """`_record`'s writes in the caller's transaction, returning each recorded firing's result and the Tasks an
        `overlap = replace` firing cancelled; fresh on each attempt (what a lost commit wrote is seen, and nothing
        of `due` changes)."""
        open_ = await self.store.claim_unrecorded(conn, [d.firing_id for d in due])
        live = [d for d in due if d.firing_id in open_]
        results = {d.firing_id: d.result for d in live if d.result is not None}
        replaced = await self._replace_in(conn, live, now, results)
        tasks = [(d.firing_id, Admit(exempt=d.exempt, task=d.task)) for d in live
                 if d.task is not None and results.get(d.firing_id, ("ok",))[0] == "ok"]
        # The same admitter as `task_submit`: a Task beyond its creator's queue limit is not inserted, and its
        # firing records the refusal.
        refused = await self.admitter.admit(conn, [a for _, a in tasks])
        for i, e in refused.items():
            results[tasks[i][0]] = (_refused(e), None, None)
        # A refused dispatch has no outcome to wait for: it is reconciled at once.
        await self.store.record(conn, [
            DispatchResult(firing_id=fid, admission=adm, task_id=tid, turn_id=uid,
                           reconciled_at=None if adm == "ok" else now) for fid, (adm, tid, uid) in results.items()])
        events = [self._event(d.schedule, d.firing_id, d.nominal, None, results[d.firing_id][0])
                  for d in live if results[d.firing_id][0] != "ok"]
        return events, results, replaced

    # ------------------------------------------------------------ reconcile

    async def reconcile(self) -> int:
        """Copy canonical terminal outcomes onto firings; mark never-recorded dispatches `unknown`; return how many."""
        if not await self.store.any_unreconciled():
            return 0  # nothing to reconcile: a read, no write transaction
        now = self.clock.now()
        events: list[FiringOutcome] = []
        async with self.db.write() as conn:
            # Tasks: the Task record is the canonical outcome; a vanished Task is an unavailable observation.
            for r in await self.store.claim_finished_tasks(conn):
                outcome = r.status if r.status in TASK_OUTCOMES else "unknown"
                events += await self._settle(conn, r, outcome, now)
            # Dispatch never recorded (the hub died between commit and dispatch): unknown, never replayed.
            cutoff = now - timedelta(seconds=self.settings.unknown_after_s)
            for r in await self.store.claim_never_recorded(conn, cutoff):
                events += await self._settle(conn, r, "unknown", now)
            sessions = self.sessions
            turn_rows = [] if sessions is None else await self.store.open_turns(conn)
        for r in turn_rows:
            try:
                outcome = await sessions.turn_outcome(r.turn_id) if sessions is not None else None
            except Exception:  # an unavailable observation stays open; it never implies failure
                log.warning("turn outcome of %s unavailable", r.turn_id, exc_info=True)
                continue
            if outcome is None:
                continue
            async with self.db.write() as conn:
                events += await self._settle(conn, r, outcome, now)
        await self._publish(events)
        return len(events)

    async def _settle(self, conn: Connection, r: Row, outcome: str, now: datetime) -> list[FiringOutcome]:
        """Reconcile one firing unless another reconciliation did already; return its event (or none)."""
        if not await self.store.settle(conn, r.id, outcome, now):
            return []
        return [self._event(r, r.id, utc(r.nominal_time), outcome, r.admission, schedule_id=r.schedule_id)]

    # ------------------------------------------------------------ events and loops

    @staticmethod
    def _event(row: Row, firing_id: str, nominal: datetime, outcome: str | None, admission: str | None, *,
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
            except Exception:  # the ledger is the truth; a lost event is logged
                log.exception("outcome sink refused the event for firing %s", e.firing_id)

    async def _next_fire_s(self) -> float | None:
        """Seconds until the soonest fire time (≤ 0: due now), read alone outside any transaction; None: nothing
        is scheduled."""
        async with self.db.read() as conn:
            nxt = await self.store.next_fire_at(conn)
        return None if nxt is None else (utc(nxt) - self.clock.now()).total_seconds()

    async def firing_step(self) -> float:
        """Fire one batch of due schedules; run again at once while the batch was full (the supervisor yields
        between batches), else sleep until the next fire time (at most `poll_s`, cut short by `kicked`). A step with
        nothing due is one read: no write transaction (on SQLite, the one writer other work waits for)."""
        wait = await self._next_fire_s()
        if wait is not None and wait <= 0:
            if await self.fire_due() >= self.settings.claim_batch:
                return 0.0
            wait = await self._next_fire_s()
        return self.settings.poll_s if wait is None else max(0.0, min(self.settings.poll_s, wait))

    def start_loops(self, loops: Loops) -> None:
        """Start the firing loops: `firing_workers` of them ("schedule-firing", "schedule-firing-2", …), so one
        batch's claim overlaps another's dispatch. They claim apart exactly as replicas do (SKIP LOCKED on
        PostgreSQL, the writer lock on SQLite); a kick wakes whichever sleeps."""
        for i in range(self.settings.firing_workers):
            loops.start("schedule-firing" + (f"-{i + 1}" if i else ""), self.firing_step,
                        interval_s=self.settings.poll_s, wake=self.kicked)

    async def reconciler_step(self) -> None:
        """Reconcile outcomes once; the supervisor runs it every `reconcile_s`."""
        await self.reconcile()
