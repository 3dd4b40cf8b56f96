"""The schedule aggregate's store interface (`SqlScheduleStore`): definitions, who may see them, and the identity
facts their attribution reads; services/schedules holds it through this."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from ..db import Connection
from ..records import ScheduleRecord
from ..schedules import Binding, Visibility


class ScheduleStore(Protocol):
    """Schedule definitions, who may see them, and the identity facts their attribution reads."""

    async def insert(self, conn: Connection, values: dict[str, Any]) -> None:
        """Insert one definition."""

    async def get(self, conn: Connection, schedule_id: str, v: Visibility, *,
                  lock: bool = False) -> ScheduleRecord | None:
        """Return the schedule when `v` admits it, else None."""

    async def update(self, conn: Connection, schedule_id: str, values: dict[str, Any]) -> None:
        """Write the given columns of one schedule."""

    async def mark_deleted(self, conn: Connection, schedule_id: str, now: datetime) -> None:
        """Mark a schedule deleted; its history stays."""

    async def visible(self, conn: Connection, v: Visibility, *, limit: int | None,
                      offset: int = 0) -> list[ScheduleRecord]:
        """Return the schedules `v` admits, newest first, each with its creator's name."""

    async def count_visible(self, conn: Connection, v: Visibility) -> int:
        """Count the schedules `v` admits."""

    async def creator_name(self, conn: Connection, principal_id: str | None) -> str | None:
        """Return the name of a schedule's creator."""

    async def active_bindings(self, conn: Connection, principal_id: str) -> list[Binding]:
        """Return the principal's active identity bindings."""

    async def execution_access(self, conn: Connection, principal_id: str) -> bool:
        """Return whether the principal exists and its execution access is not revoked."""

    async def binding(self, conn: Connection, binding_id: str) -> Binding | None:
        """Return one identity binding, or None."""

    async def active_binding_of(self, conn: Connection, app_id: str, open_id: str) -> Binding | None:
        """Return the active binding of a Feishu user, or None."""

    async def turn_receipt(self, conn: Connection, turn_id: str) -> dict[str, Any]:
        """Return the receipt frozen in a Turn's snapshot."""

    async def app_timezone(self, conn: Connection, app_id: str) -> str | None:
        """Return the timezone recorded for a Feishu application, or None."""

    async def task_result_text(self, conn: Connection, task_id: str) -> str | None:
        """Return the result text of a firing's Task."""

    async def active_incident_count(self, conn: Connection, app_id: str) -> int:
        """Return how many incidents of an application are active."""
