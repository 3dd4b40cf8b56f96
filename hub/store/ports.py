"""The interfaces of the task, schedule, instance and session stores, over the records they return
(hub/store/records.py).

Services hold a store through these Protocols (`TaskService.store: TaskStore`), so what a service may ask of the
store, and what shape it gets back, is written in one place; `SqlTaskStore`, `SqlScheduleStore`,
`SqlInstanceStore` and `SqlSessionStore` implement them on SQLite and PostgreSQL (mypy checks that they do)."""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from ..domain.tasks import Status
from .db import Connection
from .records import FiringRef, ScheduleRecord, TaskEventRecord, TaskLine, TaskRunRecord
from .records import CurrentRun, InstanceRecord, Mail, OwnerRun, SessionLine, SessionRecord, SessionRun
from .schedules import Binding, Visibility
from .sessions import DelegationParent, NewRun, NewSession
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


class InstanceStore(Protocol):
    """Agent Instances (an owner's persistent agent bound to one child Session) and their mailbox."""

    async def create(self, conn: Connection, *, instance_id: str, owner_id: str, name: str | None, session_id: str,
                     snapshot: dict[str, Any], now: datetime) -> None:
        """Insert an instance bound to its child session and frozen `snapshot`, with no run yet."""

    async def get(self, conn: Connection, instance_id: str) -> InstanceRecord | None:
        """Return the instance, or None, its row held to the transaction's end: writers of one instance queue up."""

    async def ids_of_owner(self, conn: Connection, owner_id: str, *, archived: bool, limit: int) -> list[str]:
        """Return the ids of the owner's instances, newest first (archived ones only when `archived`)."""

    async def set_current_run(self, conn: Connection, instance_id: str, task_id: str, now: datetime) -> None:
        """Make `task_id` the instance's current run (what steer, interrupt, wait and archive act on)."""

    async def archive(self, conn: Connection, instance_id: str, now: datetime) -> None:
        """Mark the instance archived at `now`; it takes no more work."""

    async def current_run(self, conn: Connection, task_id: str | None) -> CurrentRun | None:
        """Return the status and runtime of the instance's current run `task_id`, or None when it has none."""

    async def unfinished_runs(self, conn: Connection, instance_id: str) -> list[OwnerRun]:
        """Return every owner TaskRun of the instance not yet terminal, oldest first (not only the current one)."""

    async def queued_mail(self, conn: Connection, instance_id: str) -> list[Mail]:
        """Return the instance's queued mailbox input, oldest first: the order it goes ahead of the next prompt."""

    async def count_queued(self, conn: Connection, instance_id: str) -> int:
        """Count the instance's queued mailbox input (not yet delivered to any run)."""

    async def deliver(self, conn: Connection, message_ids: Sequence[str], task_id: str, now: datetime) -> None:
        """Mark the messages delivered into the run `task_id` (they were prepended to its prompt)."""

    async def add_mail(self, conn: Connection, *, message_id: str, instance_id: str, text: str, kind: str,
                       state: str, now: datetime, task_id: str | None = None) -> None:
        """Insert a mailbox message; `state` queued waits for the next run, pending is offered to the running `task_id`.
        """

    async def mail_state(self, conn: Connection, message_id: str) -> str | None:
        """Return the message's state (queued, pending, delivered, unknown), or None when there is no such one."""

    async def mail_note(self, conn: Connection, message_id: str) -> str | None:
        """Return why a steer was queued rather than delivered (the runner's reason), or None."""

    async def give_up_steer(self, conn: Connection, message_id: str, now: datetime) -> bool:
        """Mark a steer that is still pending as unknown (never queued); False when its runner settled it first."""


class SessionStore(Protocol):
    """Sessions, the runs queued in them (Turns, and an instance's owner TaskRuns) and their sticky runtime."""

    async def id_by_name(self, conn: Connection, owner_id: str, name: str) -> str | None:
        """Return the id of the owner's session called `name`, or None (a name is the owner's alone)."""

    async def ids_by_ref(self, conn: Connection, owner_id: str, ref: str) -> list[str]:
        """Return the ids of the owner's sessions whose id or name is `ref` (other owners' sessions never match)."""

    async def runtime_id(self, conn: Connection, runtime_name: str) -> str | None:
        """Return the id of the runtime named `runtime_name` a new session sticks to, or None when none has it."""

    async def runtime_name(self, conn: Connection, runtime_id: str | None) -> str | None:
        """Return the name of a session's sticky runtime, or None when it has none (yet) or it is gone."""

    async def create(self, conn: Connection, new: NewSession, now: datetime) -> None:
        """Insert a session with no runs (`turns` 0), created and updated at `now`."""

    async def get(self, conn: Connection, session_id: str, *, lock: bool = False) -> SessionRecord | None:
        """Return the session, or None; with `lock`, hold its row to the transaction's end (writers queue up)."""

    async def owned(self, conn: Connection, owner_id: str, limit: int) -> list[SessionLine]:
        """Return up to `limit` of the owner's sessions (never another owner's), most recently updated first;
        ties in `updated_at` go newest id first, so pages are stable."""

    async def queue_run(self, conn: Connection, session: SessionRecord, run: NewRun, now: datetime) -> int:
        """Queue `run` as the session's next run (seq `turns + 1`) and return the seq; `session` was read with
        `lock` in this transaction, so the seqs of one session never repeat or skip."""

    async def run_status(self, conn: Connection, run_id: str) -> str | None:
        """Return the status of the run `run_id` (a Turn or a TaskRun), or None when there is no such run."""

    async def turn(self, conn: Connection, turn_id: str) -> TaskRunRecord | None:
        """Return the Turn's run, or None: a TaskRun's id names no Turn."""

    async def recent_runs(self, conn: Connection, session_id: str, limit: int) -> list[SessionRun]:
        """Return the session's last `limit` runs, newest seq first."""

    @staticmethod
    async def delegation_parent(conn: Connection, session_id: str, owner_id: str) -> DelegationParent | None:
        """Return the owner's session with its running run of highest seq; None when it is not the owner's."""
