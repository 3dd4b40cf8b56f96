"""The interfaces of the task and schedule stores, over the records they return (hub/store/records.py).

Services hold a store through these Protocols (`TaskService.store: TaskStore`), so what a service may ask of the
store, and what shape it gets back, is written in one place; `SqlTaskStore` and `SqlScheduleStore` implement them on
SQLite and PostgreSQL (mypy checks that they do)."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from ..domain.tasks import Status
from .db import Connection
from .records import FiringRef, ScheduleRecord, TaskEventRecord, TaskLine, TaskRunRecord
from .schedules import Binding, Visibility
from .tasks import QueuedTask


class TaskStore(Protocol):
    """Task runs, their event logs and permission answers."""

    async def lock_principal(self, conn: Connection, principal_id: str) -> None:
        """Hold the principal's row until the transaction ends (its submissions count one after another)."""

    async def count_queued(self, conn: Connection, owner_id: str, at_most: int | None = None) -> int:
        """Count the principal's queued runs, reading no more than `at_most`."""

    async def insert_queued_many(self, conn: Connection, tasks: list[QueuedTask]) -> None:
        """Insert admitted tasks, queued, with one statement."""

    async def get(self, conn: Connection, task_id: str) -> TaskRunRecord | None:
        """Return a run, or None."""

    async def get_for_update(self, conn: Connection, task_id: str) -> TaskRunRecord | None:
        """Return a run locked until the transaction ends, or None."""

    async def firing_of(self, conn: Connection, task_id: str) -> FiringRef | None:
        """Return the schedule firing that admitted the task, or None."""

    async def list_tasks(self, conn: Connection, owner_id: str, limit: int) -> list[TaskLine]:
        """Return the owner's most recent tasks, newest first."""

    async def events_after(self, conn: Connection, task_id: str, cursor: int, limit: int) -> list[TaskEventRecord]:
        """Return events after `cursor`, in order."""

    async def append_event(self, conn: Connection, task_id: str, type_: str, payload: dict[str, Any],
                           now: datetime) -> int:
        """Append one event; return its seq."""

    async def request_cancel(self, conn: Connection, task_id: str, now: datetime) -> None:
        """Mark a running task's cancellation as requested."""

    async def finish(self, conn: Connection, task_id: str, status: Status, now: datetime, *, error: str | None = None,
                     result_text: str | None = None, result_json: Any = None, usage: Any = None,
                     changed_files: Any = None, last_rseq: int | None = None, resume_handle: str | None = None,
                     started_at: datetime | None = None, event_seq: int | None = None,
                     release: bool = True) -> bool:
        """Move an active run to a terminal status; False when it was already terminal."""

    async def permission_requests(self, conn: Connection, task_id: str) -> list[dict[str, Any]]:
        """Return the payloads of the run's permission requests."""

    async def permission_answer(self, conn: Connection, task_id: str, request_id: str) -> bool | None:
        """Return the answer to a permission request, or None while unanswered."""

    async def record_permission_answer(self, conn: Connection, task_id: str, request_id: str, allow: bool,
                                       message: str, now: datetime) -> None:
        """Store the one answer to a permission request."""


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
