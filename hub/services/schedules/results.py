"""A schedule's Results view: one firing's Task result, and why the Task did not succeed.

ScheduleService.result_page checks access (the schedule's frozen creator) and picks the firing; this adds the
error the hub recorded on that firing's Task, read by the firing's id, so the error always belongs to the firing
shown even when a newer one arrives in between.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ...store.db import Database
from ...store.firings import SqlFiringStore
from ..auth.service import Caller
from .views import UNSUCCESSFUL, ResultPage

if TYPE_CHECKING:
    from .service import ScheduleService


class ScheduleResults:
    """Read the caller's schedule results with the error of each unsuccessful Task."""

    def __init__(self, db: Database, schedules: ScheduleService) -> None:
        self.db = db
        self.schedules = schedules
        self.firings = SqlFiringStore(db)

    async def page(self, caller: Caller, schedule_id: str, page: int) -> ResultPage:
        """Return the `page`-th newest firing with a Task (clamped), its result text and, unless it succeeded,
        its error; refuse as ScheduleService.result_page does."""
        r = await self.schedules.result_page(caller, schedule_id, page)
        if r.firing is None or r.firing.state not in UNSUCCESSFUL:
            return r
        async with self.db.read() as conn:
            error = await self.firings.task_error(conn, r.firing.firing_id)
        return replace(r, error=error or "")
