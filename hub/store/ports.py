"""The interfaces of the stores, over the records they return (hub/store/records.py, and the records defined beside
a store: hub/store/leases.py, questions.py).

Services hold a store through these Protocols (`TaskService.store: TaskStore`), so what a service may ask of the
store, and what shape it gets back, is written in one place; `SqlTaskStore`, `SqlScheduleStore`, `SqlLeaseStore`,
`SqlMemoryStore`, `SqlQuestionStore`, `SqlInstanceStore` and `SqlSessionStore` implement them on SQLite and
PostgreSQL (mypy checks that they do)."""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from ..domain.tasks import Status
from .db import Connection
from .leases import Box, BoxLine, BoxSessionRecord, LeaseGate, LeaseTask, TaskPage
from .questions import NewQuestion, QuestionRecord
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


class LeaseStore(Protocol):
    """Lease tasks, the boxes inside them, and the Boxes page's sign-in sessions."""

    async def task(self, conn: Connection, task_id: str, *, lock: bool = False) -> LeaseTask | None:
        """Return a lease task; `lock` holds it until the transaction ends."""

    async def task_with_live_boxes(self, conn: Connection, task_id: str) -> tuple[LeaseGate | None, list[Box]]:
        """Return what the lease gate reads of a task and its live boxes, oldest first, in one query."""

    async def task_with_box(self, conn: Connection, task_id: str,
                            box_id: str) -> tuple[LeaseTask | None, Box | None]:
        """Return a lease task and one of its boxes in any state (None when it has no such box), in one query."""

    async def open_task(self, conn: Connection, *, task_id: str, owner_id: str, name: str, holder_label: str,
                        holder_token_id: str, secret_hash: str, now: datetime) -> LeaseTask:
        """Open a task held by the handle whose secret hashes to `secret_hash`."""

    async def touch(self, conn: Connection, task_id: str, secret_hash: str, now: datetime) -> None:
        """Move the activity clock of an open task still held by the handle hashing to `secret_hash`."""

    async def attach(self, conn: Connection, task_id: str, *, secret_hash: str, holder_label: str,
                     holder_token_id: str, now: datetime) -> LeaseTask:
        """Mint a new secret hash for the task, so the previous handle stops working."""

    async def release(self, conn: Connection, task_id: str, now: datetime) -> LeaseTask:
        """Drop the task's secret hash; a release counts as activity."""

    async def close(self, conn: Connection, task_id: str, now: datetime, reason: str) -> None:
        """Close the task for good and drop its secret hash."""

    async def close_quiet(self, conn: Connection, cutoff: datetime, now: datetime, reason: str, limit: int) -> int:
        """Close up to `limit` open tasks quiet since `cutoff`; return how many closed."""

    async def lock_owner(self, conn: Connection, owner_id: str) -> None:
        """Hold the owner's principal row until the transaction ends."""

    async def count_open_tasks(self, conn: Connection, owner_id: str) -> int:
        """Return how many of an owner's tasks are open."""

    async def count_owner_live_boxes(self, conn: Connection, owner_id: str) -> int:
        """Return how many boxes of an owner's tasks still hold resources."""

    async def open_tasks(self, conn: Connection, owner_id: str) -> list[LeaseTask]:
        """Return an owner's open tasks, most recently active first."""

    async def open_tasks_page(self, conn: Connection, owner_id: str, size: int, *,
                              after: tuple[datetime, str] | None = None,
                              before: tuple[datetime, str] | None = None) -> TaskPage:
        """Return one page of an owner's open tasks with their live boxes and the count of all of them."""

    async def recently_closed(self, conn: Connection, owner_id: str, limit: int) -> list[LeaseTask]:
        """Return an owner's `limit` most recently closed tasks, newest first."""

    async def live_boxes_of_open_tasks(self, conn: Connection, owner_id: str) -> list[BoxLine]:
        """Return the live boxes of an owner's open tasks, oldest first."""

    async def live_box_ids(self, conn: Connection, task_id: str) -> list[str]:
        """Return the ids of a task's live boxes, oldest first."""

    async def count_live_boxes(self, conn: Connection, task_id: str) -> int:
        """Return how many boxes of a task still hold resources."""

    async def add_box(self, conn: Connection, *, box_id: str, task_id: str, name: str | None, driver: str,
                      provisional: dict[str, Any], now: datetime) -> None:
        """Record a box as `creating` with its provisional handle."""

    async def box_made(self, conn: Connection, box_id: str, handle: dict[str, Any]) -> bool:
        """Mark a `creating` box live with the driver's handle; False when it stopped being."""

    async def box_failed(self, conn: Connection, box_id: str, now: datetime) -> None:
        """Mark a box the driver could not make as failed."""

    async def mark_destroyed(self, conn: Connection, box_id: str, now: datetime) -> bool:
        """Mark a box being made or live destroyed; False when it was not."""

    async def box(self, conn: Connection, box_id: str, task_id: str | None = None) -> Box | None:
        """Return a box in any state; with `task_id`, only when it belongs to that task."""

    async def live_boxes_of(self, conn: Connection, task_ids: list[str]) -> list[Box]:
        """Return the boxes of these tasks that still hold resources, oldest first."""

    async def stuck_boxes(self, conn: Connection, cutoff: datetime, limit: int) -> list[Box]:
        """Return up to `limit` boxes left `creating` since `cutoff` or before, oldest first."""

    async def closed_tasks_with_live_boxes(self, conn: Connection, limit: int) -> list[str]:
        """Return up to `limit` closed tasks that still have boxes holding resources."""

    async def open_box_session(self, conn: Connection, *, session_id: str, principal_id: str, token_id: str,
                               session_hash: str, now: datetime, expires_at: datetime) -> None:
        """Store a Boxes page session by the hash of its secret."""

    async def box_session(self, conn: Connection, session_id: str) -> BoxSessionRecord | None:
        """Return a session with its principal's name and its token's label, admin, kind and revocation."""

    async def revoke_box_session(self, conn: Connection, session_id: str, session_hash: str, now: datetime) -> bool:
        """End a session when the secret's hash matches and it is still open; return whether it ended now."""


class MemoryStore(Protocol):
    """Memory entries by (scope, key) and the scope a session is bound to."""

    async def session_scope(self, conn: Connection, session_id: str) -> str | None:
        """Return the scope stored on the session as it is, or None."""

    async def run_has_memory(self, conn: Connection, task_id: str) -> bool:
        """Say whether the runtime holding the run reported the memory capability."""

    async def get(self, conn: Connection, scope: str, key: str) -> str | None:
        """Return the value of `key` in `scope`, or None."""

    async def put(self, conn: Connection, scope: str, key: str, value: str, now: datetime) -> None:
        """Create `key` in `scope`, or replace its value."""

    async def delete(self, conn: Connection, scope: str, key: str) -> bool:
        """Delete `key` from `scope`; False when it was not there."""

    async def keys(self, conn: Connection, scope: str) -> list[str]:
        """Return the keys of `scope`, in order."""


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
