"""The task aggregate's store interfaces: runs with their event logs and permission answers (`SqlTaskStore`), and the
questions a Turn's agent asks its person (`SqlQuestionStore`); services/tasks holds them through these."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from ...domain.tasks import Status
from ..db import Connection
from ..questions import NewQuestion, QuestionRecord
from ..records import FiringRef, TaskEventRecord, TaskLine, TaskRunRecord
from ..tasks import QueuedTask


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


class QuestionStore(Protocol):
    """Session questions and the one answer each may get."""

    @staticmethod
    async def record(conn: Connection, new: NewQuestion, now: datetime) -> None:
        """Store the question of a Turn that ended waiting for the person, open; a Turn's second report adds none."""

    async def get(self, conn: Connection, question_id: str) -> QuestionRecord | None:
        """Return the question with its Turn's status, or None."""

    async def of_turn(self, conn: Connection, turn_id: str) -> QuestionRecord | None:
        """Return the question a Turn ended on, in any state, or None."""

    async def waiting(self, conn: Connection, session_id: str) -> QuestionRecord | None:
        """Return the session's open question whose Turn still waits for the person, or None."""

    async def answer(self, conn: Connection, question_id: str, answer: str, answer_turn_id: str,
                     now: datetime) -> bool:
        """Mark an open question answered by a Turn; False, with nothing written, when it is not open."""

    async def cancel_waiting_turn(self, conn: Connection, turn_id: str, now: datetime) -> bool:
        """Cancel a Turn that waits for the person and withdraw its open question; False when it does not wait."""
