"""Creator recovery on upgrade (`amux db recover-creators`): bind existing schedules, record every outcome.

Rules (see docs/recovery.md and `hub.domain.recovery`):
- Idempotent: the cutoff is the time of the first real run and is reused by every later run; an outcome
  is recorded once per schedule and never revisited, so a second run writes nothing.
- `dry_run` decides with the recorded cutoff (or now) and writes nothing.
- Hydration only: a bound schedule gets its binding and application, its incidents get the application
  and creator, and its already-reconciled firings are marked decided so the alert catch-up never turns
  past outcomes into notices. No Task is admitted, no outbox row is written.
- Unbound schedules keep their creator (operator/CLI access is unchanged) and are listed, with the reason,
  for the administrator's diagnostics.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa

from ..clock import Clock, utc
from ..domain import recovery as rules
from ..ids import new_id
from ..store.db import Database
from ..store.tables import (api_tokens, decisions, firings, identity_bindings, incidents, principals,
                            recovery_results, recovery_runs, schedules)
from .schedule_access import FeishuScope, for_identity as visible_to_identity

HYDRATED = "recovered_history"
HYDRATED_DETAIL = "historical outcome hydrated by creator recovery: never notified"


def _iso(dt: datetime | None) -> str | None:
    dt = utc(dt)
    return dt.isoformat() if dt else None


class RecoveryService:
    """Recover schedule creators once, and answer the diagnostics and personal-view reads that follow."""

    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock

    # ------------------------------------------------------------ the operation

    async def recover_creators(self, dry_run: bool = False) -> dict:
        """Decide every existing schedule and (unless `dry_run`) record outcomes and hydrate bound ones."""
        now = self.clock.now()
        if dry_run:
            async with self.db.read() as conn:
                return await self._run(conn, now, dry_run=True)
        async with self.db.write() as conn:
            return await self._run(conn, now, dry_run=False)

    async def _run(self, conn, now: datetime, *, dry_run: bool) -> dict:  # noqa: ANN001
        first = (await conn.execute(sa.select(recovery_runs).order_by(recovery_runs.c.started_at).limit(1))).first()
        cutoff = utc(first.cutoff) if first is not None else now
        recorded = {r.schedule_id: r for r in (await conn.execute(sa.select(recovery_results))).all()}
        rows = (await conn.execute(sa.select(schedules).order_by(schedules.c.created_at, schedules.c.id))).all()
        ctx = await self._context(conn, rows)
        report, new = [], []
        for row in rows:
            principal = ctx["principals"].get(row.creator_id)
            if row.id in recorded:
                r = recorded[row.id]
                report.append(self._entry(row, principal, r.outcome, r.reason, r.binding_id, r.app_id, recorded=True))
                continue
            token_id = (row.provenance or {}).get("token_id") if isinstance(row.provenance, dict) else None
            v = rules.decide(row, principal, ctx["tokens"].get(token_id), ctx["bindings"].get(row.creator_id, []), cutoff)
            report.append(self._entry(row, principal, v.outcome, v.reason, v.binding_id, v.app_id, recorded=False))
            if v.outcome != rules.IGNORED:
                new.append((row, v))
        counts = {k: sum(1 for e in report if e["outcome"] == k and not e["recorded"])
                  for k in (rules.BOUND, rules.UNBOUND, rules.IGNORED)}
        run_id = first.id if first is not None else None
        if not dry_run and (first is None or new):
            run_id = new_id("rcv")
            await conn.execute(recovery_runs.insert().values(id=run_id, cutoff=cutoff, started_at=now, finished_at=now,
                                                             dry_run=False, counts=counts))
            for row, v in new:
                await self._record(conn, run_id, row, v, now)
        return {"cutoff": _iso(cutoff), "cutoff_recorded": first is not None, "dry_run": dry_run, "run_id": run_id,
                "counts": counts, "schedules": report}

    async def _context(self, conn, rows: list[Any]) -> dict:  # noqa: ANN001
        """Load creators, receipt tokens and every binding of those creators (all applications, any status)."""
        creators = {r.creator_id for r in rows if r.creator_id}
        tokens = {r.provenance.get("token_id") for r in rows if isinstance(r.provenance, dict)} - {None}
        out: dict[str, dict] = {"principals": {}, "tokens": {}, "bindings": {}}
        if creators:
            out["principals"] = {p.id: p for p in (await conn.execute(
                sa.select(principals).where(principals.c.id.in_(creators)))).all()}
            for b in (await conn.execute(sa.select(identity_bindings).where(
                    identity_bindings.c.principal_id.in_(creators)).order_by(identity_bindings.c.id))).all():
                out["bindings"].setdefault(b.principal_id, []).append(b)
        if tokens:
            out["tokens"] = {t.id: t for t in (await conn.execute(
                sa.select(api_tokens.c.id, api_tokens.c.principal_id).where(api_tokens.c.id.in_(tokens)))).all()}
        return out

    @staticmethod
    def _entry(row: Any, principal: Any, outcome: str, reason: str, binding_id: str | None, app_id: str | None,
               *, recorded: bool) -> dict:
        return {"schedule_id": row.id, "name": row.name, "schedule_type": row.type,
                "creator": principal.name if principal is not None else None, "created_at": _iso(row.created_at),
                "outcome": outcome, "reason": reason, "binding_id": binding_id, "app_id": app_id, "recorded": recorded}

    async def _record(self, conn, run_id: str, row: Any, v: rules.Verdict, now: datetime) -> None:  # noqa: ANN001
        await conn.execute(recovery_results.insert().values(
            schedule_id=row.id, run_id=run_id, outcome=v.outcome, reason=v.reason, binding_id=v.binding_id,
            app_id=v.app_id, creator_id=row.creator_id, recorded_at=now))
        await self._mark_history(conn, row.id, now)
        if v.outcome != rules.BOUND:
            return
        await conn.execute(schedules.update().where(schedules.c.id == row.id, schedules.c.creator_binding_id.is_(None))
                           .values(creator_binding_id=v.binding_id, app_id=v.app_id))
        await conn.execute(incidents.update().where(incidents.c.schedule_id == row.id)
                           .values(app_id=v.app_id, creator_id=row.creator_id))

    async def _mark_history(self, conn, schedule_id: str, now: datetime) -> None:  # noqa: ANN001
        """Mark reconciled, never-decided firings as decided, so past outcomes are never notified."""
        key = firings.c.id + sa.literal(":") + sa.cast(firings.c.missed_count, sa.String)
        rows = (await conn.execute(
            sa.select(firings.c.id, firings.c.outcome, firings.c.admission, firings.c.missed_count)
            .outerjoin(decisions, decisions.c.ingest_key == key)
            .where(firings.c.schedule_id == schedule_id, firings.c.reconciled_at.is_not(None),
                   decisions.c.id.is_(None)))).all()
        if rows:
            await conn.execute(decisions.insert(), [
                {"id": new_id("dec"), "at": now, "ingest_key": f"{f.id}:{f.missed_count}", "firing_id": f.id,
                 "schedule_id": schedule_id, "incident_id": None, "notice_id": None,
                 "outcome": f.outcome or f.admission, "decision": HYDRATED, "detail": HYDRATED_DETAIL} for f in rows])

    # ------------------------------------------------------------ reads

    async def unbound(self, app_id: str | None = None) -> list[dict]:
        """List schedules recovery left unbound, with the reason (the administrator's diagnostics).

        With `app_id`, only those whose creator has (or had) an alias in that application, or none anywhere.
        """
        stmt = (sa.select(recovery_results, schedules.c.name, schedules.c.deleted_at, principals.c.name.label("creator"))
                .join(schedules, schedules.c.id == recovery_results.c.schedule_id)
                .outerjoin(principals, principals.c.id == recovery_results.c.creator_id)
                .where(recovery_results.c.outcome == rules.UNBOUND, schedules.c.deleted_at.is_(None))
                .order_by(recovery_results.c.recorded_at, recovery_results.c.schedule_id))
        if app_id is not None:
            any_alias = sa.select(identity_bindings.c.id).where(identity_bindings.c.principal_id == recovery_results.c.creator_id)
            stmt = stmt.where(sa.or_(sa.exists(any_alias.where(identity_bindings.c.app_id == app_id)),
                                     ~sa.exists(any_alias)))
        async with self.db.read() as conn:
            rows = (await conn.execute(stmt)).all()
        return [{"schedule_id": r.schedule_id, "name": r.name, "creator": r.creator, "creator_id": r.creator_id,
                 "reason": r.reason, "recorded_at": _iso(r.recorded_at)} for r in rows]

    async def unbound_for_app(self, app_id: str) -> list[dict]:
        """List the unbound schedules an application's administrator can attribute (see `unbound`)."""
        return await self.unbound(app_id)

    async def is_unbound(self, schedule_id: str) -> bool:
        """Return whether recovery left this schedule unbound (it then gets no proactive notifications)."""
        async with self.db.read() as conn:
            return (await conn.execute(sa.select(recovery_results.c.outcome).where(
                recovery_results.c.schedule_id == schedule_id))).scalar() == rules.UNBOUND

    async def personal(self, app_id: str, open_id: str) -> list[dict]:
        """Return this Feishu user's personal view: the hub's one schedule policy (`schedule_access`), checked now.

        Nothing is returned when the alias is revoked or unknown, and a schedule whose creator is no longer
        the alias's principal is not shown: a past binding grants nothing by itself.
        """
        async with self.db.read() as conn:
            b = (await conn.execute(sa.select(identity_bindings).where(
                identity_bindings.c.app_id == app_id, identity_bindings.c.open_id == open_id,
                identity_bindings.c.status == "active"))).first()
            if b is None:
                return []
            rows = (await conn.execute(
                sa.select(schedules, recovery_results.c.outcome.label("recovery"))
                .outerjoin(recovery_results, recovery_results.c.schedule_id == schedules.c.id)
                .where(visible_to_identity(b.principal_id, FeishuScope(app_id, b.id)), schedules.c.deleted_at.is_(None))
                .order_by(schedules.c.created_at.desc()))).all()
        return [{"schedule_id": r.id, "name": r.name, "rule": r.rule, "timezone": r.timezone, "paused": r.paused,
                 "next_fire_at": _iso(r.next_fire_at), "app_id": r.app_id, "recovered": r.recovery == rules.BOUND}
                for r in rows]
