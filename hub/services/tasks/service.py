"""Task admission, reads, waiting and cancellation."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Awaitable, Callable

from ...clock import Clock, utc
from ...config import ExecutionSettings, HubSettings
from ...domain import isolation
from ...domain.limits import applied_limits
from ...domain.pages import MAX_TASKS, page_limit
from ...domain.placement import waiting_for
from ...domain.tasks import Status, is_terminal
from ...domain.timeline import page_path
from ...errors import Conflict, Invalid, NotFound, TooMany
from ...ids import new_id
from ...store.db import Connection, Database, Row
from ...store.execution_uids import SqlExecutionUidStore
from ...store.questions import SqlQuestionStore
from ...store.registry import SqlRegistryStore
from ...loops import Background
from ...store.ports.tasks import TaskStore
from ...store.records import TaskRunRecord
from ...store.tasks import QueuedTask, SqlTaskStore
from .admission import Admission, SubmitRequest
from ..auth.service import Caller
from .delegation import SESSION_LABEL, delegation_parent
from ..notify import Notifier, task_key
from ..views import ChangedFiles, TaskResult, TaskView

# A coordinating parent agent is not woken for pure tool or usage updates (seed: coordination wait).
QUIET_FOR_COORDINATION = ("tool", "usage")

__all__ = ["Admit", "PermissionService", "QueueAdmitter", "SubmitRequest", "TaskService", "finish_task"]
NOT_YOURS = "task {task_id!r} does not exist or is not yours; list your tasks with `amux task list`"


@dataclass(frozen=True)
class Admit:
    """One task to admit: its frozen task, and whether it is exempt from queue limits (an admin token)."""

    exempt: bool
    task: QueuedTask


class QueueAdmitter:
    """The one admission step of every queued Task (`task_submit`, `task_run`, a schedule's firing): the
    per-principal queue limit, then the insert (`QueuedTask`), in the caller's transaction."""

    def __init__(self, db: Database, settings: HubSettings) -> None:
        self.store: TaskStore = SqlTaskStore(db)
        self.settings = settings

    async def admit(self, conn: Connection, batch: list[Admit]) -> dict[int, TooMany]:
        """Insert the batch's tasks in the caller's transaction, refusing each task beyond its principal's
        `hub.max_queued_per_principal` queued ones (exempt ones are not counted against it) in the order they were
        submitted, as one by one; return the refusals by position (a refused task is not inserted)."""
        limit = self.settings.max_queued_per_principal
        queued: dict[str, int] = {}
        refused: dict[int, TooMany] = {}
        admitted = []
        # Lock each limited principal's row so concurrent submissions on PostgreSQL count one after another; in one
        # order (by id), so two replicas' batches naming the same principals cannot deadlock.
        for owner in sorted({a.task.owner_id for a in batch if limit and not a.exempt}):
            await self.store.lock_principal(conn, owner)
            queued[owner] = await self.store.count_queued(conn, owner, at_most=limit)
        for i, a in enumerate(batch):
            owner = a.task.owner_id
            if limit and not a.exempt:
                if queued[owner] >= limit:
                    refused[i] = TooMany(
                        f"you already have {limit} queued tasks, the limit "
                        f"(hub.max_queued_per_principal = {limit}); wait for some to start or cancel them with "
                        "`task_cancel`, or ask the operator to raise it")
                    continue
                queued[owner] += 1
            admitted.append(a.task)
        await self.store.insert_queued_many(conn, admitted)
        return refused


class _GroupCommit:
    """Group commit of concurrent submissions: every submission that arrives while one transaction runs is inserted
    by the next, with one statement; each caller is answered once the transaction that holds its task committed
    (or with its own refusal). One writer at a time on SQLite made each submission wait its turn for a transaction
    of its own; here they share one (bench/dispatch)."""

    MAX_BATCH = 200

    def __init__(self, db: Database, apply: Callable[[Connection, list[Admit]], Awaitable[dict[int, TooMany]]],
                 on_committed: Callable[[], None]) -> None:
        self.db = db
        self.apply = apply
        self.on_committed = on_committed
        self.background = Background("task-admission")
        self._pending: list[tuple[Admit, asyncio.Future[None]]] = []
        self._draining: asyncio.Task[object] | None = None

    async def admit(self, item: Admit) -> None:
        """Queue `item` for the next transaction and wait for its outcome (a refusal or a database error raises)."""
        entry = (item, asyncio.get_running_loop().create_future())
        self._pending.append(entry)
        if self._draining is None or self._draining.done():
            self._draining = self.background.spawn(self._drain())
        try:
            await asyncio.shield(entry[1])
        except asyncio.CancelledError:
            if entry in self._pending:  # not taken yet: it is never inserted
                self._pending.remove(entry)
            raise

    def _inserting(self, items: list[Admit]) -> Callable[[Connection], Awaitable[dict[int, TooMany]]]:
        async def insert(conn: Connection) -> dict[int, TooMany]:
            return await self.apply(conn, items)
        return insert

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[:self.MAX_BATCH], self._pending[self.MAX_BATCH:]
            try:
                refused = await self.db.transaction(self._inserting([a for a, _ in batch]))
            except Exception as e:  # noqa: BLE001 — each waiting caller gets the error its transaction met
                for _, done in batch:
                    if not done.done():
                        done.set_exception(e)
                continue
            except BaseException:
                for _, done in batch + self._pending:
                    done.cancel()
                raise
            for i, (_, done) in enumerate(batch):
                if not done.done():
                    done.set_exception(refused[i]) if i in refused else done.set_result(None)
            if len(refused) < len(batch):
                self.on_committed()


class TaskService:
    """Admit Tasks (freezing their snapshot) and answer questions about them."""

    def __init__(self, db: Database, clock: Clock, notifier: Notifier, settings: HubSettings,
                 admission: Admission, on_admitted: Callable[[], None] | None = None,
                 execution: ExecutionSettings | None = None) -> None:
        self.db = db
        self.execution = execution or ExecutionSettings()
        self.store: TaskStore = SqlTaskStore(db)
        self.runtimes = SqlRegistryStore(db)
        self.clock = clock
        self.notifier = notifier
        self.settings = settings
        self.admission = admission
        self.on_admitted = on_admitted or (lambda: None)
        self.queue = QueueAdmitter(db, settings)  # schedule firings admit through it too
        self._admitter = _GroupCommit(db, self.queue.admit, lambda: self.on_admitted())

    async def submit(self, caller: Caller, req: SubmitRequest, *, origin: str = "submit") -> dict:
        """Admit a Task: validate, resolve, freeze its snapshot and queue it for dispatch."""
        async with self.db.read() as conn:
            parent, parent_turn, context = await delegation_parent(conn, caller)
            snapshot = await self.admission.freeze(conn, caller, req, origin=origin, session=context)
        task = QueuedTask(task_id=new_id("tr"), owner_id=caller.principal_id, name=req.name, prompt=req.prompt,
                          snapshot=snapshot, now=self.clock.now(), parent_session_id=parent, parent_turn_id=parent_turn)
        await self._admitter.admit(Admit(exempt=caller.admin, task=task))
        return {"task_id": task.task_id, "status": Status.QUEUED.value}

    async def aclose(self) -> None:
        """Stop admitting (a submission still waiting for its commit is cancelled)."""
        await self._admitter.background.aclose()

    async def _row(self, conn: Connection, caller: Caller, task_id: str) -> TaskRunRecord:
        row = await self.store.get(conn, task_id)
        if row is None or (row.owner_id != caller.principal_id and not caller.admin) or row.kind != "task":
            raise NotFound(NOT_YOURS.format(task_id=task_id))
        return row

    async def get(self, caller: Caller, task_id: str) -> TaskView:
        """Return a task's public view."""
        async with self.db.read() as conn:
            return await self.view_of(conn, await self._row(conn, caller, task_id))

    async def view_of(self, conn: Connection, row: TaskRunRecord | Row) -> TaskView:
        """Return the public view of a run (a Task, or a Turn's row) the caller may already see."""
        runtime_name, caps = None, dict[str, Any]()
        if row.runtime_id:
            runtime_name, caps = await self.runtimes.name_of(conn, row.runtime_id)
        done = is_terminal(row.status)
        return TaskView(
            task_id=row.id,
            name=row.name,
            status=row.status,
            outcome=row.outcome,
            result=TaskResult(text=row.result_text or "", json=row.result_json) if done else None,
            usage=row.usage_json,
            changed_files=ChangedFiles(**(row.changed_files or {})),
            error=row.error,
            runtime=runtime_name,
            snapshot=row.snapshot,
            limits=applied_limits(row.snapshot, caps),
            **await self._provenance(conn, row),
            waiting_for=await self._waiting_for(conn, row) if row.status == Status.QUEUED.value else None,
            created_at=_iso(row.created_at),
            started_at=_iso(row.started_at),
            finished_at=_iso(row.finished_at),
            timeline_page=page_path(row.kind, row.id),
        )

    async def _provenance(self, conn: Connection, row: TaskRunRecord | Row) -> dict[str, str | None]:
        """Where the task came from: the Session and Turn that delegated it, its instance, the schedule firing."""
        firing = None
        if row.snapshot.get("origin") in (None, "schedule"):  # only a schedule's firing (or an older row) has one
            firing = await self.store.firing_of(conn, row.id)
        return {
            "parent_session_id": row.parent_session_id,
            "parent_turn_id": row.parent_turn_id,
            "instance_id": row.instance_id,
            "schedule_id": firing.schedule_id if firing is not None else None,
            "firing_id": firing.id if firing is not None else None,
        }

    async def _waiting_for(self, conn: Connection, row: TaskRunRecord | Row) -> str:
        ex = self.execution
        if isolation.runs_as_principal(row.snapshot) and await SqlExecutionUidStore().exhausted(
                conn, row.owner_id, ex.uid_base, ex.uid_count):
            return isolation.uid_exhausted_text(ex.uid_base, ex.uid_count)
        return waiting_for(row.snapshot, row.owner_id, await self.runtimes.list_all(conn))

    async def events(self, caller: Caller, task_id: str, cursor: int = 0, limit: int = 500) -> dict:
        """Return events after `cursor` and the next cursor."""
        if not isinstance(cursor, int) or cursor < 0:
            raise Invalid("cursor must be a non-negative integer (the `cursor` of the previous answer, or 0)")
        limit = max(1, min(int(limit), 1000))
        async with self.db.read() as conn:
            row = await self._row(conn, caller, task_id)
            evs = await self.store.events_after(conn, task_id, cursor, limit)
        out = [{"seq": e.seq, "type": e.type, **e.payload, "at": _iso(e.created_at)} for e in evs]
        return {"task_id": task_id, "status": row.status, "outcome": row.outcome,
                "events": out, "cursor": out[-1]["seq"] if out else cursor, "done": is_terminal(row.status)}

    async def wait(self, caller: Caller, task_id: str, cursor: int = 0, timeout_s: float = 30.0) -> dict:
        """Return new events (or terminal status) as soon as there are any, else after `timeout_s`; never cancels."""
        timeout_s = max(0.0, min(float(timeout_s), 600.0))
        loop_deadline = _monotonic() + timeout_s
        quiet = QUIET_FOR_COORDINATION if caller.label and caller.label.startswith(SESSION_LABEL) else ()
        seen: list[dict] = []
        while True:
            ans = await self.events(caller, task_id, cursor)
            seen += ans["events"]
            cursor = ans["cursor"]  # the cursor advances over every event, quiet ones included
            remaining = loop_deadline - _monotonic()
            wake = any(e["type"] not in quiet for e in ans["events"])
            if wake or ans["done"] or remaining <= 0:
                ans["events"] = seen
                ans["timed_out"] = not (wake or ans["done"])
                return ans
            await self.notifier.wait(task_key(task_id), min(remaining, self.settings.poll_s * 4))

    async def run(self, caller: Caller, req: SubmitRequest) -> TaskView:
        """Submit and block until the task is terminal."""
        sub = await self.submit(caller, req, origin="run")
        return await self.wait_terminal(caller, sub["task_id"])

    async def wait_terminal(self, caller: Caller, task_id: str, timeout_s: float | None = None) -> TaskView:
        """Block until `task_id` is terminal (or `timeout_s`), then return its view."""
        deadline = None if timeout_s is None else _monotonic() + timeout_s
        while True:
            view = await self.get(caller, task_id)
            if is_terminal(view.status) or (deadline is not None and _monotonic() >= deadline):
                return view
            wait = self.settings.poll_s * 4
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - _monotonic()))
            await self.notifier.wait(task_key(task_id), wait)

    async def cancel_in(self, conn: Connection, caller: Caller, task_id: str,
                        now: datetime) -> tuple[TaskRunRecord, Status | None]:
        """Cancel a task in the caller's transaction: end it at once when not yet running, else ask its runner (the
        status it then has; None when it had ended). Call `cancelled` once the transaction has committed."""
        row = await self.store.get_for_update(conn, task_id)
        if row is None or (row.owner_id != caller.principal_id and not caller.admin):
            raise NotFound(NOT_YOURS.format(task_id=task_id))
        if row.status == Status.WAITING_FOR_USER:  # a Turn waiting on its question: the question is withdrawn
            done = await SqlQuestionStore(self.db).cancel_waiting_turn(conn, task_id, now)
            return row, Status.CANCELLED if done else None
        if is_terminal(row.status):
            return row, None
        if row.status == Status.RUNNING:
            await self.store.request_cancel(conn, task_id, now)
            return row, Status.RUNNING
        await self.store.finish(conn, task_id, Status.CANCELLED, now, error="cancelled before it started")
        return row, Status.CANCELLED

    def cancelled(self, row: TaskRunRecord) -> None:
        """Wake what a committed cancellation concerns: the task's waiters and its runtime's runner pump."""
        self.notifier.notify(task_key(row.id))
        if row.runtime_id:
            self.notifier.notify(f"runtime:{row.runtime_id}")

    async def cancel(self, caller: Caller, task_id: str) -> dict:
        """Cancel a task: at once when not yet running, else through its runner."""
        now = self.clock.now()
        row, status = await self.db.transaction(lambda conn: self.cancel_in(conn, caller, task_id, now))
        attempt = row.attempt or None  # the attempt it acted on; a task cancelled before any started has none
        if status is None:
            return {"task_id": task_id, "status": row.status, "outcome": row.outcome, "note": "already finished",
                    "attempt": attempt}
        self.cancelled(row)
        return {"task_id": task_id, "status": status.value,
                "outcome": status.value if status == Status.CANCELLED else None, "attempt": attempt}

    async def list(self, caller: Caller, limit: int = 50) -> list[dict]:
        """Return the caller's most recent tasks."""
        async with self.db.read() as conn:
            rows = await self.store.list_tasks(conn, caller.principal_id, page_limit(limit, MAX_TASKS, "tasks"))
        return [{"task_id": r.id, "name": r.name, "status": r.status, "created_at": _iso(r.created_at)} for r in rows]


async def finish_task(conn: Connection, task_id: str, status: Status, now: datetime, *, error: str | None = None,
                      result_text: str | None = None, result_json: Any = None, usage: Any = None,
                      changed_files: Any = None, last_rseq: int | None = None,
                      resume_handle: str | None = None) -> bool:
    """Move an active task to a terminal status and release its reservation; False if it was already terminal."""
    return await SqlTaskStore.finish(conn, task_id, status, now, error=error, result_text=result_text,
                                     result_json=result_json, usage=usage, changed_files=changed_files,
                                     last_rseq=last_rseq, resume_handle=resume_handle)


def _iso(dt: datetime | None) -> str | None:
    dt = utc(dt)
    return dt.isoformat() if dt else None


def _monotonic() -> float:
    return time.monotonic()



class PermissionService:
    """Answer permission requests of escalate-to-main tasks (seed: decisions are explicit and tied to the task)."""

    def __init__(self, db: Database, clock: Clock, notifier: Notifier) -> None:
        self.db = db
        self.clock = clock
        self.notifier = notifier
        self.store: TaskStore = SqlTaskStore(db)

    async def respond(self, caller: Caller, task_id: str, request_id: str, allow: bool, message: str = "") -> dict:
        """Record the answer to one request; the runner holding the task delivers it to the engine."""
        now = self.clock.now()

        async def answer(conn: Connection) -> TaskRunRecord:
            row = await self.store.get_for_update(conn, task_id)
            if row is None or (row.owner_id != caller.principal_id and not caller.admin):
                raise NotFound(NOT_YOURS.format(task_id=task_id))
            if row.snapshot.get("permission_policy") != "escalate-to-main":
                raise Conflict(f"task {task_id} runs under {row.snapshot.get('permission_policy')}; "
                               "only escalate-to-main tasks ask for permission")
            if row.status != Status.RUNNING.value:
                when = "has ended" if is_terminal(row.status) else "is not running yet"
                raise Conflict(f"task {task_id} is {row.status}: it {when}, so no permission request {request_id!r} "
                               "waits and nothing was sent; see task_get for its state and outcome")
            asked = await self.store.permission_requests(conn, task_id)
            if not any(p.get("request_id") == request_id for p in asked):
                known = ", ".join(sorted({str(p.get("request_id")) for p in asked})) or "none yet"
                raise NotFound(f"task {task_id} has no permission request {request_id!r} (requests: {known}); "
                               "see task_events")
            done = await self.store.permission_answer(conn, task_id, request_id)
            if done is not None:
                raise Conflict(f"permission request {request_id} of task {task_id} was already answered "
                               f"({'allow' if done else 'deny'}) and no longer waits; nothing was sent — "
                               "see task_events for what the task did next")
            await self.store.record_permission_answer(conn, task_id, request_id, bool(allow), message[:2000], now)
            await self.store.append_event(conn, task_id, "permission_answer",
                                          {"request_id": request_id, "allow": bool(allow)}, now)
            return row

        row = await self.db.transaction(answer)
        self.notifier.notify(f"runtime:{row.runtime_id}")
        self.notifier.notify(task_key(task_id))
        return {"task_id": task_id, "request_id": request_id, "allow": bool(allow), "status": "sent",
                "attempt": row.attempt}
