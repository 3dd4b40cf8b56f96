"""The Agent Timeline (docs/timeline.md): read a run's raw agent events (its owner, hub admins, and the
administrator of a Feishu application whose alert center shows the run); sweep old ones."""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from ...clock import Clock, utc
from ...config import TimelineSettings
from ...domain.tasks import is_terminal
from ...domain.timeline import expired_before
from ...errors import Invalid, NotFound
from ...store.db import Database
from ...store.tasks import SqlTaskStore
from ...store.timeline import SqlTimelineStore
from ..auth.service import Caller

Kind = Literal["task", "turn"]
NOT_YOURS = {
    "task": "task {id!r} does not exist or is not yours; list your tasks with `amux task list`",
    "turn": "turn {id!r} does not exist or is not yours; see your session's turns with `amux session get`",
}
MAX_PAGE = 1000


class TimelineService:
    """Answer a run's timeline to its owner, a hub admin, or the administrator of a Feishu application whose alert
    center shows it; delete events past `timeline.retention_s`."""

    def __init__(self, db: Database, clock: Clock, settings: TimelineSettings | None = None) -> None:
        self.db = db
        self.clock = clock
        self.settings = settings or TimelineSettings()
        self.tasks = SqlTaskStore(db)

    async def read(self, caller: Caller, kind: Kind, run_id: str, cursor: int = 0, limit: int = 500) -> dict:
        """Return the run's raw events after `cursor` (a runner sequence) and the next cursor.

        Another principal's run, a run of the other kind and a missing run answer the same 404: a timeline never
        says whether someone else's run exists. The administrator of a Feishu application reads the runs its alert
        center shows them (a firing's Task or Turn of a schedule with an incident there), on every door alike."""
        if not isinstance(cursor, int) or isinstance(cursor, bool) or cursor < 0:
            raise Invalid("cursor must be a non-negative integer (the `cursor` of the previous answer, or 0)")
        limit = max(1, min(int(limit), MAX_PAGE))
        async with self.db.read() as conn:
            row = await self.tasks.get(conn, run_id)
            if row is None or row.kind != kind or not (
                    row.owner_id == caller.principal_id or caller.admin
                    or await SqlTimelineStore.shown_to_app_admin(conn, run_id, caller.principal_id)):
                raise NotFound(NOT_YOURS[kind].format(id=run_id))
            events = await SqlTimelineStore.after(conn, run_id, cursor, limit)
        out = [{"seq": e.rseq, "type": e.type, **(e.payload if isinstance(e.payload, dict) else {"value": e.payload}),
                "at": _iso(e.created_at)} for e in events]
        return {f"{kind}_id": run_id, "status": row.status, "outcome": row.outcome, "name": row.name,
                "events": out, "cursor": out[-1]["seq"] if out else cursor,
                "done": is_terminal(row.status) and len(out) < limit, "retention_s": self.settings.retention_s}

    async def sweep_step(self) -> float | None:
        """Delete one batch of events older than the retention; come back at once while a full batch went."""
        before = expired_before(self.clock.now(), self.settings.retention_s)
        gone = await self.db.transaction(
            lambda conn: SqlTimelineStore.sweep(conn, before, self.settings.sweep_batch))
        return 0.0 if gone >= self.settings.sweep_batch else None


def _iso(dt: object) -> str | None:
    value = utc(dt) if isinstance(dt, datetime) else None
    return value.isoformat() if value else None
