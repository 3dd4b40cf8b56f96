"""Task admission, reads, waiting and cancellation."""
from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

from ..clock import Clock, utc
from ..config import HubSettings
from ..domain.tasks import ACTIVE, Status, is_terminal
from ..errors import Conflict, Invalid, NotFound, TooMany
from ..ids import new_id
from ..store.db import Database
from ..store.tables import permission_replies, principals, reservations, runtimes, task_events, task_runs
from .admission import Admission, SubmitRequest
from .auth import Caller
from .delegation import SESSION_LABEL, delegation_parent
from .notify import Notifier

# A coordinating parent agent is not woken for pure tool or usage updates (seed: coordination wait).
QUIET_FOR_COORDINATION = ("tool", "usage")

__all__ = ["PermissionService", "SubmitRequest", "TaskService", "finish_task", "task_key"]


def task_key(task_id: str) -> str:
    """Notifier key for a task's changes."""
    return f"task:{task_id}"


class TaskService:
    """Admit Tasks (freezing their snapshot) and answer questions about them."""

    def __init__(self, db: Database, clock: Clock, notifier: Notifier, settings: HubSettings,
                 admission: Admission, on_admitted=None) -> None:  # noqa: ANN001
        self.db = db
        self.clock = clock
        self.notifier = notifier
        self.settings = settings
        self.admission = admission
        self.on_admitted = on_admitted or (lambda: None)

    async def submit(self, caller: Caller, req: SubmitRequest, *, origin: str = "submit") -> dict:
        """Admit a Task: validate, resolve, freeze its snapshot and queue it for dispatch."""
        async with self.db.read() as conn:
            parent, parent_turn, context = await delegation_parent(conn, caller)
            snapshot = await self.admission.freeze(conn, caller, req, origin=origin, session=context)
        now = self.clock.now()
        task_id = new_id("tr")
        async with self.db.write() as conn:
            await self._check_queue_limit(conn, caller)
            await conn.execute(task_runs.insert().values(
                id=task_id, owner_id=caller.principal_id, name=req.name, prompt=req.prompt, snapshot=snapshot,
                status=Status.QUEUED, attempt=0, event_seq=0, last_rseq=0, created_at=now,
                parent_session_id=parent, parent_turn_id=parent_turn,
            ))
        self.on_admitted()
        return {"task_id": task_id, "status": Status.QUEUED.value}

    async def _check_queue_limit(self, conn, caller: Caller) -> None:  # noqa: ANN001
        """Refuse a principal's task beyond `hub.max_queued_per_principal` queued ones (admin tokens are exempt)."""
        limit = self.settings.max_queued_per_principal
        if not limit or caller.admin:
            return
        # Lock the principal's row so concurrent submissions on PostgreSQL count one after another.
        await conn.execute(self.db.for_update(sa.select(principals.c.id).where(principals.c.id == caller.principal_id)))
        queued = (await conn.execute(sa.select(sa.func.count()).select_from(task_runs).where(
            task_runs.c.owner_id == caller.principal_id, task_runs.c.status == Status.QUEUED.value))).scalar_one()
        if queued >= limit:
            raise TooMany(f"you already have {queued} queued tasks, the limit (hub.max_queued_per_principal = {limit}); "
                          "wait for some to start or cancel them with `task_cancel`, or ask the operator to raise it")

    async def _row(self, conn, caller: Caller, task_id: str) -> Any:  # noqa: ANN001
        row = (await conn.execute(sa.select(task_runs).where(task_runs.c.id == task_id))).first()
        if row is None or (row.owner_id != caller.principal_id and not caller.admin) or row.kind != "task":
            raise NotFound(f"task {task_id!r} does not exist or is not yours; list your tasks with `amux task list`")
        return row

    async def get(self, caller: Caller, task_id: str) -> dict:
        """Return a task's public view."""
        async with self.db.read() as conn:
            return await self._view(conn, await self._row(conn, caller, task_id))

    async def _view(self, conn, row) -> dict:  # noqa: ANN001
        runtime_name = None
        if row.runtime_id:
            runtime_name = (await conn.execute(sa.select(runtimes.c.name).where(runtimes.c.id == row.runtime_id))).scalar()
        done = is_terminal(row.status)
        return {
            "task_id": row.id,
            "name": row.name,
            "status": row.status,
            "outcome": row.outcome,
            "result": {"text": row.result_text or "", "json": row.result_json} if done else None,
            "usage": row.usage_json,
            "changed_files": row.changed_files or {"created": [], "modified": [], "deleted": []},
            "error": row.error,
            "runtime": runtime_name,
            "snapshot": row.snapshot,
            "waiting_for": await self._waiting_for(conn, row) if row.status == Status.QUEUED.value else None,
            "created_at": _iso(row.created_at),
            "started_at": _iso(row.started_at),
            "finished_at": _iso(row.finished_at),
        }

    async def _waiting_for(self, conn, row) -> str:  # noqa: ANN001
        from .dispatch import waiting_for  # dispatch imports this module

        return waiting_for(row, (await conn.execute(sa.select(runtimes))).all())

    async def events(self, caller: Caller, task_id: str, cursor: int = 0, limit: int = 500) -> dict:
        """Return events after `cursor` and the next cursor."""
        if not isinstance(cursor, int) or cursor < 0:
            raise Invalid("cursor must be a non-negative integer (the `cursor` of the previous answer, or 0)")
        limit = max(1, min(int(limit), 1000))
        async with self.db.read() as conn:
            row = await self._row(conn, caller, task_id)
            evs = (await conn.execute(
                sa.select(task_events.c.seq, task_events.c.type, task_events.c.payload, task_events.c.created_at)
                .where(task_events.c.task_id == task_id, task_events.c.seq > cursor)
                .order_by(task_events.c.seq).limit(limit)
            )).all()
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

    async def run(self, caller: Caller, req: SubmitRequest) -> dict:
        """Submit and block until the task is terminal."""
        sub = await self.submit(caller, req, origin="run")
        return await self.wait_terminal(caller, sub["task_id"])

    async def wait_terminal(self, caller: Caller, task_id: str, timeout_s: float | None = None) -> dict:
        """Block until `task_id` is terminal (or `timeout_s`), then return its view."""
        deadline = None if timeout_s is None else _monotonic() + timeout_s
        while True:
            view = await self.get(caller, task_id)
            if is_terminal(view["status"]) or (deadline is not None and _monotonic() >= deadline):
                return view
            wait = self.settings.poll_s * 4 if deadline is None else min(self.settings.poll_s * 4, max(0.0, deadline - _monotonic()))
            await self.notifier.wait(task_key(task_id), wait)

    async def cancel(self, caller: Caller, task_id: str) -> dict:
        """Cancel a task: at once when not yet running, else through its runner."""
        now = self.clock.now()
        async with self.db.write() as conn:
            row = (await conn.execute(self.db.for_update(sa.select(task_runs).where(task_runs.c.id == task_id)))).first()
            if row is None or (row.owner_id != caller.principal_id and not caller.admin):
                raise NotFound(f"task {task_id!r} does not exist or is not yours; list your tasks with `amux task list`")
            if is_terminal(row.status):
                return {"task_id": task_id, "status": row.status, "outcome": row.outcome, "note": "already finished"}
            if row.status == Status.RUNNING:
                await conn.execute(task_runs.update().where(task_runs.c.id == task_id).values(cancel_requested_at=now))
                status = Status.RUNNING
            else:
                await finish_task(conn, task_id, Status.CANCELLED, now, error="cancelled before it started")
                status = Status.CANCELLED
        self.notifier.notify(task_key(task_id))
        if row.runtime_id:
            self.notifier.notify(f"runtime:{row.runtime_id}")
        return {"task_id": task_id, "status": status.value, "outcome": status.value if status == Status.CANCELLED else None}

    async def list(self, caller: Caller, limit: int = 50) -> list[dict]:
        """Return the caller's most recent tasks."""
        async with self.db.read() as conn:
            rows = (await conn.execute(
                sa.select(task_runs.c.id, task_runs.c.name, task_runs.c.status, task_runs.c.created_at)
                .where(task_runs.c.owner_id == caller.principal_id, task_runs.c.kind == "task")
                .order_by(task_runs.c.created_at.desc()).limit(max(1, min(limit, 500)))
            )).all()
        return [{"task_id": r.id, "name": r.name, "status": r.status, "created_at": _iso(r.created_at)} for r in rows]


async def finish_task(conn, task_id: str, status: Status, now, *, error: str | None = None,  # noqa: ANN001
                      result_text: str | None = None, result_json: Any = None, usage: Any = None,
                      changed_files: Any = None, last_rseq: int | None = None, resume_handle: str | None = None) -> bool:
    """Move an active task to a terminal status and release its reservation; False if it was already terminal."""
    values: dict[str, Any] = {"status": status.value, "outcome": status.value, "finished_at": now}
    for key, val in (("error", error), ("result_text", result_text), ("result_json", result_json),
                     ("usage_json", usage), ("changed_files", changed_files), ("last_rseq", last_rseq),
                     ("resume_handle", resume_handle)):
        if val is not None:
            values[key] = val
    res = await conn.execute(
        task_runs.update().where(task_runs.c.id == task_id, task_runs.c.status.in_([s.value for s in ACTIVE])).values(**values)
    )
    if res.rowcount == 0:
        return False
    await conn.execute(
        reservations.update().where(reservations.c.task_id == task_id, reservations.c.state != "released")
        .values(state="released", released_at=now)
    )
    return True


def _iso(dt) -> str | None:  # noqa: ANN001
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

    async def respond(self, caller: Caller, task_id: str, request_id: str, allow: bool, message: str = "") -> dict:
        """Record the answer to one request; the runner holding the task delivers it to the engine."""
        now = self.clock.now()
        async with self.db.write() as conn:
            row = (await conn.execute(self.db.for_update(sa.select(task_runs).where(task_runs.c.id == task_id)))).first()
            if row is None or (row.owner_id != caller.principal_id and not caller.admin):
                raise NotFound(f"task {task_id!r} does not exist or is not yours; list your tasks with `amux task list`")
            if row.snapshot.get("permission_policy") != "escalate-to-main":
                raise Conflict(f"task {task_id} runs under {row.snapshot.get('permission_policy')}; only escalate-to-main tasks ask for permission")
            if row.status != Status.RUNNING.value:
                raise Conflict(f"task {task_id} is {row.status}; there is nothing left to answer")
            asked = [e.payload for e in await conn.execute(sa.select(task_events.c.payload).where(
                task_events.c.task_id == task_id, task_events.c.type == "permission"))]
            if not any(p.get("request_id") == request_id for p in asked):
                known = ", ".join(sorted({str(p.get("request_id")) for p in asked})) or "none yet"
                raise NotFound(f"task {task_id} has no permission request {request_id!r} (requests: {known}); see task_events")
            done = (await conn.execute(sa.select(permission_replies.c.allow).where(
                permission_replies.c.task_id == task_id, permission_replies.c.request_id == request_id))).first()
            if done is not None:
                raise Conflict(f"permission request {request_id} of task {task_id} was already answered ({'allow' if done.allow else 'deny'})")
            await conn.execute(permission_replies.insert().values(
                task_id=task_id, request_id=request_id, allow=bool(allow), message=message[:2000], created_at=now))
            seq = row.event_seq + 1
            await conn.execute(task_events.insert().values(
                task_id=task_id, seq=seq, type="permission_answer", created_at=now,
                payload={"request_id": request_id, "allow": bool(allow)}))
            await conn.execute(task_runs.update().where(task_runs.c.id == task_id).values(event_seq=seq))
        self.notifier.notify(f"runtime:{row.runtime_id}")
        self.notifier.notify(task_key(task_id))
        return {"task_id": task_id, "request_id": request_id, "allow": bool(allow), "status": "sent"}
