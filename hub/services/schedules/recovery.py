"""Creator recovery on upgrade (`amux db recover-creators`): bind existing schedules, record every outcome.

Rules (see docs/recovery.md and `hub.domain.recovery`):
- The cutoff is the upgrade's time, recorded by migration 0024 when it ran (never later than the first real
  run's, which every later run reuses): a schedule created after the upgrade is never recovered.
- Idempotent: an outcome is recorded once per schedule and never revisited, so a second run writes nothing.
- `dry_run` decides with the recorded cutoff (or now) and writes nothing.
- Hydration only: a bound schedule gets its binding and application, its incidents get the application
  and creator, and its already-reconciled firings are marked decided so the alert catch-up never turns
  past outcomes into notices. No Task is admitted, no outbox row is written.
- Unbound schedules keep their creator (operator/CLI access is unchanged) and are listed, with the reason,
  for the administrator's diagnostics.
"""
from __future__ import annotations

from datetime import datetime

from ...clock import Clock, iso, utc
from ...domain import recovery as rules
from ...ids import new_id
from ...store.db import Connection, Database, Row
from ...store.recovery import RecoveryResult, SqlRecoveryStore

HYDRATED = "recovered_history"
HYDRATED_DETAIL = "historical outcome hydrated by creator recovery: never notified"



class RecoveryService:
    """Recover schedule creators once, and report every schedule's outcome with its reason."""

    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock
        self.store = SqlRecoveryStore(db)

    # ------------------------------------------------------------ the operation

    async def recover_creators(self, dry_run: bool = False) -> dict:
        """Decide every existing schedule and (unless `dry_run`) record outcomes and hydrate bound ones."""
        now = self.clock.now()
        if dry_run:
            async with self.db.read() as conn:
                return await self._run(conn, now, dry_run=True)
        async with self.db.write() as conn:
            return await self._run(conn, now, dry_run=False)

    async def _run(self, conn: Connection, now: datetime, *, dry_run: bool) -> dict:
        first = await self.store.first_run(conn)
        cutoff: datetime = (utc(first.cutoff) or now) if first is not None else now
        source = "first_run" if first is not None else "now"
        upgraded = utc(await self.store.upgrade_cutoff(conn))
        if upgraded is not None and upgraded <= cutoff:
            cutoff, source = upgraded, "upgrade"
        recorded = await self.store.results(conn)
        rows = await self.store.every_schedule(conn)
        ctx = await self._context(conn, rows)
        report, new = [], []
        for row in rows:
            principal = ctx["principals"].get(row.creator_id)
            if row.id in recorded:
                r = recorded[row.id]
                report.append(self._entry(row, principal, r.outcome, r.reason, r.binding_id, r.app_id, recorded=True))
                continue
            token_id = (row.provenance or {}).get("token_id") if isinstance(row.provenance, dict) else None
            v = rules.decide(row, principal, ctx["tokens"].get(token_id), ctx["bindings"].get(row.creator_id, []),
                             cutoff)
            report.append(self._entry(row, principal, v.outcome, v.reason, v.binding_id, v.app_id, recorded=False))
            if v.outcome != rules.IGNORED:
                new.append((row, v))
        counts = {k: sum(1 for e in report if e["outcome"] == k and not e["recorded"])
                  for k in (rules.BOUND, rules.UNBOUND, rules.IGNORED)}
        run_id = first.id if first is not None else None
        if not dry_run and (first is None or new):
            run_id = new_id("rcv")
            await self.store.insert_run(conn, run_id, cutoff, now, counts)
            for row, v in new:
                await self._record(conn, run_id, row, v, now)
        return {"cutoff": iso(cutoff), "cutoff_recorded": first is not None,
                "cutoff_source": source, "dry_run": dry_run, "run_id": run_id,
                "counts": counts, "schedules": report}

    async def _context(self, conn: Connection, rows: list[Row]) -> dict:
        """Load creators, receipt tokens and every binding of those creators (all applications, any status)."""
        creators = {r.creator_id for r in rows if r.creator_id}
        tokens = {t for t in (r.provenance.get("token_id") for r in rows if isinstance(r.provenance, dict))
                  if isinstance(t, str)}
        return {"principals": await self.store.principals(conn, creators),
                "tokens": await self.store.tokens(conn, tokens),
                "bindings": await self.store.bindings_of(conn, creators)}

    @staticmethod
    def _entry(row: Row, principal: Row | None, outcome: str, reason: str, binding_id: str | None, app_id: str | None,
               *, recorded: bool) -> dict:
        return {"schedule_id": row.id, "name": row.name, "schedule_type": row.type,
                "creator": principal.name if principal is not None else None, "created_at": iso(row.created_at),
                "outcome": outcome, "reason": reason, "binding_id": binding_id, "app_id": app_id, "recorded": recorded}

    async def _record(self, conn: Connection, run_id: str, row: Row, v: rules.Verdict, now: datetime) -> None:
        await self.store.insert_result(conn, RecoveryResult(
            schedule_id=row.id, run_id=run_id, outcome=v.outcome, reason=v.reason, binding_id=v.binding_id,
            app_id=v.app_id, creator_id=row.creator_id, recorded_at=now))
        await self._mark_history(conn, row.id, now)
        if v.outcome == rules.BOUND and v.binding_id is not None and v.app_id is not None:
            await self.store.bind(conn, row.id, row.creator_id, v.binding_id, v.app_id)

    async def _mark_history(self, conn: Connection, schedule_id: str, now: datetime) -> None:
        """Mark reconciled, never-decided firings as decided, so past outcomes are never notified."""
        rows = await self.store.undecided_history(conn, schedule_id)
        if rows:
            await self.store.insert_decisions(conn, [
                {"id": new_id("dec"), "at": now, "ingest_key": f"{f.id}:{f.missed_count}", "firing_id": f.id,
                 "schedule_id": schedule_id, "incident_id": None, "notice_id": None,
                 "outcome": f.outcome or f.admission, "decision": HYDRATED, "detail": HYDRATED_DETAIL} for f in rows])
