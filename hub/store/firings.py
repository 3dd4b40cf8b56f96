"""The firing ledger: claiming due schedules, persisting firings before dispatch, recording admissions,
reconciling outcomes, and history.

History includes legacy submissions: pre-ledger records shown as `unconfirmed`, once per Task. A legacy submission
record says a Task was submitted; nothing reconciled its outcome, so it is shown with outcome `unconfirmed` and
`legacy: true`. When a ledger firing correlates the same Task, only the firing is shown (the ledger is the truth).
Older uncorrelated history is never used for alerts.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Collection, Sequence

import sqlalchemy as sa

from ..domain.states import RuntimeStatus
from ..domain.tasks import ACTIVE as TASK_ACTIVE, OUTCOMES as TASK_OUTCOMES
from .db import Connection, Database, Row
from .tables import api_tokens, firings, legacy_submissions, principals, runtimes, schedules, task_runs

UNCONFIRMED = "unconfirmed"
# The columns a reconciler row carries: the firing, and what its outcome event names of the schedule.
_RECONCILE = (firings.c.id, firings.c.nominal_time, firings.c.task_id, firings.c.turn_id, firings.c.admission,
              schedules.c.id.label("schedule_id"), schedules.c.creator_id, schedules.c.app_id, schedules.c.type,
              schedules.c.rule)
_ANY_UNRECONCILED = sa.select(firings.c.id).where(firings.c.reconciled_at.is_(None)).limit(1)


@dataclass(frozen=True, kw_only=True)
class NewFiring:
    """A firing row to insert: dispatched (`admission` None until recorded) or missed."""

    id: str
    schedule_id: str
    nominal_time: datetime
    fired_at: datetime
    admission: str | None = None
    outcome: str | None = None
    missed_count: int = 0
    reconciled_at: datetime | None = None
    manual: bool = False  # schedule_run_now: fired once at the operator's request, the rule's next time unmoved


@dataclass(frozen=True, kw_only=True)
class Creator:
    """A schedule's creator as its firing acts: its name, and whether it holds a live admin token."""

    name: str
    holds_admin: bool


@dataclass(frozen=True, kw_only=True)
class DispatchResult:
    """What a dispatch said: `ok` with the Task or Turn it made, `skipped:offline` or `error:<reason>`."""

    firing_id: str
    admission: str
    task_id: str | None = None
    turn_id: str | None = None
    reconciled_at: datetime | None = None


def _typed(value: Any, type_: Any) -> sa.ColumnElement[Any]:
    # UNION branches need explicit types on PostgreSQL (asyncpg cannot infer a bare parameter's type).
    return sa.cast(sa.literal(value) if value is not None else sa.null(), type_)


def _history(schedule_id: str) -> sa.Select:
    ledger = sa.select(firings.c.id, firings.c.nominal_time, firings.c.fired_at, firings.c.admission,
                       firings.c.task_id, firings.c.turn_id, firings.c.outcome, firings.c.missed_count,
                       firings.c.reconciled_at, firings.c.legacy,
                       firings.c.manual).where(firings.c.schedule_id == schedule_id)
    correlated = sa.exists().where(firings.c.task_id == legacy_submissions.c.task_id)
    legacy = (sa.select(
        legacy_submissions.c.id, legacy_submissions.c.submitted_at.label("nominal_time"),
        legacy_submissions.c.submitted_at.label("fired_at"),
        sa.case((legacy_submissions.c.task_id.is_not(None), _typed("ok", sa.String(500))),
                else_=_typed(None, sa.String(500))).label("admission"),
        legacy_submissions.c.task_id, _typed(None, sa.String(40)).label("turn_id"),
        _typed(UNCONFIRMED, sa.String(16)).label("outcome"), _typed(0, sa.Integer).label("missed_count"),
        _typed(None, firings.c.reconciled_at.type).label("reconciled_at"),
        _typed(True, sa.Boolean).label("legacy"), _typed(False, sa.Boolean).label("manual"))
        .where(legacy_submissions.c.schedule_id == schedule_id,
               sa.or_(legacy_submissions.c.task_id.is_(None), ~correlated)))
    both = sa.union_all(ledger, legacy).subquery("history")
    return sa.select(both).order_by(both.c.nominal_time.desc(), both.c.id.desc())


class SqlFiringStore:
    """The firing ledger on SQLite and PostgreSQL."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # ------------------------------------------------------------ claim and persist

    async def claim_due(self, conn: Connection, now: datetime, limit: int) -> list[Row]:
        """Claim up to `limit` due schedules (not paused, not deleted), soonest first, skipping rows another replica
        holds; the claim lasts until the transaction ends."""
        stmt = (sa.select(schedules).where(schedules.c.next_fire_at <= now, schedules.c.paused.is_(False),
                                           schedules.c.deleted_at.is_(None))
                .order_by(schedules.c.next_fire_at).limit(limit))
        return list((await conn.execute(self.db.for_update(stmt, skip_locked=True, of=schedules))).all())

    async def schedule_for_update(self, conn: Connection, schedule_id: str) -> Row | None:
        """Return one live schedule, locked until the transaction ends (a manual firing), or None."""
        stmt = sa.select(schedules).where(schedules.c.id == schedule_id, schedules.c.deleted_at.is_(None))
        return (await conn.execute(self.db.for_update(stmt))).first()

    async def latest_manual(self, conn: Connection, schedule_id: str) -> datetime | None:
        """Return the latest nominal time of the schedule's manual firings, or None."""
        stmt = sa.select(sa.func.max(firings.c.nominal_time)).where(firings.c.schedule_id == schedule_id,
                                                                    firings.c.manual.is_(True))
        return (await conn.execute(stmt)).scalar()

    async def get_firing(self, conn: Connection, firing_id: str) -> Row | None:
        """Return one firing."""
        return (await conn.execute(sa.select(firings).where(firings.c.id == firing_id))).first()

    async def latest(self, conn: Connection, schedule_id: str) -> Row | None:
        """Return the schedule's firing with the latest nominal time, or None."""
        stmt = (sa.select(firings).where(firings.c.schedule_id == schedule_id)
                .order_by(firings.c.nominal_time.desc()).limit(1))
        return (await conn.execute(stmt)).first()

    async def insert(self, conn: Connection, rows: Sequence[NewFiring]) -> None:
        """Insert new firings; (schedule, nominal time, manual) is unique, so inserting a pair twice fails instead of
        firing twice."""
        if rows:
            await conn.execute(firings.insert(), [{"id": r.id, "schedule_id": r.schedule_id,
                                                   "nominal_time": r.nominal_time, "fired_at": r.fired_at,
                                                   "admission": r.admission, "outcome": r.outcome,
                                                   "missed_count": r.missed_count, "reconciled_at": r.reconciled_at,
                                                   "legacy": False, "manual": r.manual} for r in rows])

    async def extend_missed(self, conn: Connection, firing_id: str, missed_count: int, now: datetime) -> None:
        """Set a missed firing's count to `missed_count` (consecutive misses collapse into one row), reconciled
        `now`."""
        await conn.execute(firings.update().where(firings.c.id == firing_id)
                           .values(missed_count=missed_count, reconciled_at=now))

    async def advance(self, conn: Connection, next_fire: Sequence[tuple[str, datetime | None]]) -> None:
        """Set each claimed schedule's next fire time (None: a consumed one-shot or a stopped rule)."""
        if next_fire:
            await conn.execute(schedules.update().where(schedules.c.id == sa.bindparam("sid"))
                               .values(next_fire_at=sa.bindparam("nxt")),
                               [{"sid": sid, "nxt": nxt} for sid, nxt in next_fire])

    async def next_fire_at(self, conn: Connection) -> datetime | None:
        """Return the soonest next fire time of any schedule that is neither paused nor deleted."""
        return (await conn.execute(sa.select(sa.func.min(schedules.c.next_fire_at)).where(
            schedules.c.paused.is_(False), schedules.c.deleted_at.is_(None)))).scalar()

    # ------------------------------------------------------------ dispatch

    async def creators(self, conn: Connection, principal_ids: Collection[str]) -> dict[str, Creator]:
        """Return each of these principals that still exists, by id, with its name and whether it holds a live
        admin token (a firing acts as its schedule's creator; an admin token's holder is exempt from the queue
        limit, as at `task_submit`)."""
        if not principal_ids:
            return {}
        holds_admin = sa.exists().where(api_tokens.c.principal_id == principals.c.id, api_tokens.c.admin.is_(True),
                                        api_tokens.c.revoked_at.is_(None))
        rows = (await conn.execute(sa.select(principals.c.id, principals.c.name, holds_admin.label("admin"))
                                   .where(principals.c.id.in_(list(principal_ids))))).all()
        return {r.id: Creator(name=r.name, holds_admin=bool(r.admin)) for r in rows}

    async def online_runtimes(self, conn: Connection) -> list[Row]:
        """Return the name and capabilities of every runtime online now (where a scheduled Task may be admitted)."""
        stmt = sa.select(runtimes.c.name, runtimes.c.capabilities).where(runtimes.c.status == RuntimeStatus.ONLINE)
        return list((await conn.execute(stmt)).all())

    async def unfinished_tasks(self, conn: Connection, schedule_ids: Collection[str]) -> dict[str, list[str]]:
        """Return, for each of these schedules that has any, the ids of the Tasks its firings admitted that are not
        finished yet (queued, dispatched or running), oldest fire first (what an overlap policy looks at)."""
        if not schedule_ids:
            return {}
        stmt = (sa.select(firings.c.schedule_id, firings.c.task_id).join(task_runs, task_runs.c.id == firings.c.task_id)
                .where(firings.c.schedule_id.in_(list(schedule_ids)), firings.c.reconciled_at.is_(None),
                       task_runs.c.status.in_([s.value for s in TASK_ACTIVE]))
                .order_by(firings.c.nominal_time))
        out: dict[str, list[str]] = {}
        for r in (await conn.execute(stmt)).all():
            out.setdefault(r.schedule_id, []).append(r.task_id)
        return out

    async def claim_unrecorded(self, conn: Connection, firing_ids: Collection[str]) -> set[str]:
        """Lock and return those of `firing_ids` whose dispatch is still unrecorded and unreconciled, skipping rows
        another replica holds: a firing the reconciler marked `unknown` takes no dispatch result."""
        if not firing_ids:
            return set()
        stmt = sa.select(firings.c.id).where(firings.c.id.in_(list(firing_ids)), firings.c.admission.is_(None),
                                             firings.c.reconciled_at.is_(None))
        return set((await conn.execute(self.db.for_update(stmt, skip_locked=True, of=firings))).scalars())

    async def record(self, conn: Connection, results: Sequence[DispatchResult]) -> None:
        """Record each firing's admission and its Task or Turn; `reconciled_at` as given (set for a refused
        dispatch, which has no outcome to wait for)."""
        if results:
            await conn.execute(firings.update().where(firings.c.id == sa.bindparam("fid")).values(
                admission=sa.bindparam("adm"), task_id=sa.bindparam("tid"), turn_id=sa.bindparam("uid"),
                reconciled_at=sa.bindparam("rat")),
                [{"fid": a.firing_id, "adm": a.admission, "tid": a.task_id, "uid": a.turn_id,
                  "rat": a.reconciled_at} for a in results])

    # ------------------------------------------------------------ reconcile

    async def any_unreconciled(self) -> bool:
        """Say whether any firing is unreconciled, read alone outside any transaction (an index probe)."""
        async with self.db.read() as conn:
            return (await conn.execute(_ANY_UNRECONCILED)).first() is not None

    async def claim_finished_tasks(self, conn: Connection, limit: int = 1000) -> list[Row]:
        """Lock and return up to `limit` unreconciled firings whose Task is terminal or gone (`status` None),
        skipping rows another replica holds; rows carry the schedule's creator, application, type and rule."""
        stmt = (sa.select(*_RECONCILE, task_runs.c.status).join(schedules, schedules.c.id == firings.c.schedule_id)
                .outerjoin(task_runs, task_runs.c.id == firings.c.task_id)
                .where(firings.c.reconciled_at.is_(None), firings.c.task_id.is_not(None),
                       sa.or_(task_runs.c.status.in_(TASK_OUTCOMES), task_runs.c.id.is_(None))).limit(limit))
        return list((await conn.execute(self.db.for_update(stmt, skip_locked=True, of=firings))).all())

    async def claim_never_recorded(self, conn: Connection, fired_before: datetime, limit: int = 1000) -> list[Row]:
        """Lock and return up to `limit` unreconciled firings fired before `fired_before` whose dispatch was never
        recorded (the hub died after persisting them), skipping rows another replica holds."""
        stmt = (sa.select(*_RECONCILE).join(schedules, schedules.c.id == firings.c.schedule_id)
                .where(firings.c.reconciled_at.is_(None), firings.c.admission.is_(None),
                       firings.c.fired_at < fired_before).limit(limit))
        return list((await conn.execute(self.db.for_update(stmt, skip_locked=True, of=firings))).all())

    async def open_turns(self, conn: Connection, limit: int = 1000) -> list[Row]:
        """Return up to `limit` unreconciled firings that delivered a Turn (their outcome is the Session's to tell)."""
        stmt = (sa.select(*_RECONCILE).join(schedules, schedules.c.id == firings.c.schedule_id)
                .where(firings.c.reconciled_at.is_(None), firings.c.turn_id.is_not(None)).limit(limit))
        return list((await conn.execute(stmt)).all())

    async def settle(self, conn: Connection, firing_id: str, outcome: str, now: datetime) -> bool:
        """Write a firing's outcome and reconcile it `now`, unless it is reconciled already; return whether this
        call did."""
        res = await conn.execute(firings.update().where(firings.c.id == firing_id, firings.c.reconciled_at.is_(None))
                                 .values(outcome=outcome, reconciled_at=now))
        return bool(res.rowcount)

    # ------------------------------------------------------------ reads

    async def history(self, conn: Connection, schedule_id: str, *, offset: int, limit: int) -> list[Row]:
        """Return one page of the schedule's ledger firings and legacy submissions, newest first; a legacy record
        whose Task a firing correlates is left out (the ledger is the truth), the others show `unconfirmed`."""
        return list((await conn.execute(_history(schedule_id).offset(offset).limit(limit))).all())

    async def recent(self, conn: Connection, schedule_ids: Collection[str], limit: int) -> list[Row]:
        """Return the latest `limit` firings of these schedules together, newest nominal time first."""
        if not schedule_ids:
            return []
        stmt = (sa.select(firings).where(firings.c.schedule_id.in_(list(schedule_ids)))
                .order_by(firings.c.nominal_time.desc()).limit(limit))
        return list((await conn.execute(stmt)).all())

    async def count_with_task(self, conn: Connection, schedule_id: str) -> int:
        """Return how many of the schedule's firings admitted a Task."""
        stmt = sa.select(sa.func.count()).select_from(firings).where(
            firings.c.schedule_id == schedule_id, firings.c.task_id.is_not(None))
        return int((await conn.execute(stmt)).scalar() or 0)

    async def nth_with_task(self, conn: Connection, schedule_id: str, index: int) -> Row | None:
        """Return the schedule's `index`-th newest firing (0 = newest) among those that admitted a Task."""
        stmt = (sa.select(firings).where(firings.c.schedule_id == schedule_id, firings.c.task_id.is_not(None))
                .order_by(firings.c.nominal_time.desc()).offset(index).limit(1))
        return (await conn.execute(stmt)).first()

    async def task_error(self, conn: Connection, firing_id: str) -> str | None:
        """Return the error the hub recorded on the Task a firing admitted (None: no Task, or it has no error)."""
        stmt = (sa.select(task_runs.c.error).select_from(firings.join(task_runs, task_runs.c.id == firings.c.task_id))
                .where(firings.c.id == firing_id))
        return (await conn.execute(stmt)).scalar()
