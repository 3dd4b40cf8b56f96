"""Creator recovery on upgrade: the recorded runs and per-schedule outcomes, the facts a decision reads, and the
hydration it writes (bindings onto schedules and incidents, past outcomes marked decided)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Collection, Sequence

import sqlalchemy as sa

from .db import Connection, Database, Row
from .tables import (api_tokens, decisions, firings, identity_bindings, incidents, principals, recovery_results,
                     recovery_runs, schedules, upgrade_marks)

UPGRADE_CUTOFF = "creator_recovery_cutoff"  # the mark migration 0024 records with the upgrade's time


@dataclass(frozen=True, kw_only=True)
class RecoveryResult:
    """One schedule's recorded recovery outcome."""

    schedule_id: str
    run_id: str
    outcome: str
    reason: str
    binding_id: str | None
    app_id: str | None
    creator_id: str | None
    recorded_at: datetime


class SqlRecoveryStore:
    """Creator recovery records on SQLite and PostgreSQL."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # ------------------------------------------------------------ what a run decides from

    async def first_run(self, conn: Connection) -> Row | None:
        """Return the first recorded run (every later run reuses its cutoff), or None before any."""
        return (await conn.execute(sa.select(recovery_runs).order_by(recovery_runs.c.started_at).limit(1))).first()

    async def upgrade_cutoff(self, conn: Connection) -> datetime | None:
        """Return the upgrade's time, as the migration recorded it when it ran (None on a schema built without it)."""
        return (await conn.execute(sa.select(upgrade_marks.c.at)
                                   .where(upgrade_marks.c.name == UPGRADE_CUTOFF))).scalar()

    async def results(self, conn: Connection) -> dict[str, Row]:
        """Return every recorded outcome by schedule id (one per schedule, never revisited)."""
        return {r.schedule_id: r for r in (await conn.execute(sa.select(recovery_results))).all()}

    async def every_schedule(self, conn: Connection) -> list[Row]:
        """Return every schedule, deleted ones included, oldest first (ties by id)."""
        return list((await conn.execute(sa.select(schedules).order_by(schedules.c.created_at, schedules.c.id))).all())

    async def principals(self, conn: Connection, ids: Collection[str]) -> dict[str, Row]:
        """Return these principals by id (missing ones are absent)."""
        if not ids:
            return {}
        rows = (await conn.execute(sa.select(principals).where(principals.c.id.in_(list(ids))))).all()
        return {p.id: p for p in rows}

    async def bindings_of(self, conn: Connection, principal_ids: Collection[str]) -> dict[str, list[Row]]:
        """Return every identity binding of these principals, in all applications and any status, by principal
        (each list in id order)."""
        if not principal_ids:
            return {}
        out: dict[str, list[Row]] = {}
        for b in (await conn.execute(sa.select(identity_bindings).where(
                identity_bindings.c.principal_id.in_(list(principal_ids))).order_by(identity_bindings.c.id))).all():
            out.setdefault(b.principal_id, []).append(b)
        return out

    async def tokens(self, conn: Connection, ids: Collection[str]) -> dict[str, Row]:
        """Return the id and principal of each of these API tokens (revoked ones included)."""
        if not ids:
            return {}
        rows = (await conn.execute(sa.select(api_tokens.c.id, api_tokens.c.principal_id)
                                   .where(api_tokens.c.id.in_(list(ids))))).all()
        return {t.id: t for t in rows}

    # ------------------------------------------------------------ what a run writes

    async def insert_run(self, conn: Connection, run_id: str, cutoff: datetime, now: datetime,
                         counts: dict[str, int]) -> None:
        """Record one real run with its cutoff and counts (a dry run records nothing)."""
        await conn.execute(recovery_runs.insert().values(id=run_id, cutoff=cutoff, started_at=now, finished_at=now,
                                                         dry_run=False, counts=counts))

    async def insert_result(self, conn: Connection, r: RecoveryResult) -> None:
        """Record one schedule's outcome; a schedule has at most one (a second insert fails)."""
        await conn.execute(recovery_results.insert().values(
            schedule_id=r.schedule_id, run_id=r.run_id, outcome=r.outcome, reason=r.reason, binding_id=r.binding_id,
            app_id=r.app_id, creator_id=r.creator_id, recorded_at=r.recorded_at))

    async def bind(self, conn: Connection, schedule_id: str, creator_id: str | None, binding_id: str,
                   app_id: str) -> None:
        """Freeze a binding and application onto a schedule that has no creator binding yet, and give its incidents
        that application and creator."""
        await conn.execute(schedules.update().where(schedules.c.id == schedule_id,
                                                    schedules.c.creator_binding_id.is_(None))
                           .values(creator_binding_id=binding_id, app_id=app_id))
        await conn.execute(incidents.update().where(incidents.c.schedule_id == schedule_id)
                           .values(app_id=app_id, creator_id=creator_id))

    async def undecided_history(self, conn: Connection, schedule_id: str) -> list[Row]:
        """Return the schedule's reconciled firings that no alert decision covers yet (the decision key is
        `<firing id>:<missed count>`)."""
        key = firings.c.id + sa.literal(":") + sa.cast(firings.c.missed_count, sa.String)
        stmt = (sa.select(firings.c.id, firings.c.outcome, firings.c.admission, firings.c.missed_count)
                .outerjoin(decisions, decisions.c.ingest_key == key)
                .where(firings.c.schedule_id == schedule_id, firings.c.reconciled_at.is_not(None),
                       decisions.c.id.is_(None)))
        return list((await conn.execute(stmt)).all())

    async def insert_decisions(self, conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
        """Insert alert decisions for past outcomes, so the alert catch-up never turns them into notices."""
        if rows:
            await conn.execute(decisions.insert(), list(rows))
