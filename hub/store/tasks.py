"""Task runs, their event logs and permission replies: the queries the task rules run."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Collection

import sqlalchemy as sa

from ..domain.tasks import ACTIVE, Status
from .db import Connection, Database, among, execute_many, one_of
from .records import FiringRef, TaskEventRecord, TaskLine, TaskRunRecord, record, records
from .tables import firings, permission_replies, principals, reservations, task_events, task_runs

ACTIVE_VALUES = [s.value for s in ACTIVE]

# Hot statements built once (building one costs more than running it; bench/dispatch).
_RUNNER_EVENTS_SEEN = (task_runs.update().where(task_runs.c.id == sa.bindparam("b_task_id"))
                       .values(event_seq=sa.bindparam("b_event_seq"), last_rseq=sa.bindparam("b_last_rseq"),
                               usage_json=sa.bindparam("b_usage_json")))
_RELEASE = (reservations.update().where(reservations.c.task_id == sa.bindparam("b_task_id"),
                                        reservations.c.state != "released")
            .values(state="released", released_at=sa.bindparam("b_now")))
_RELEASE_MANY = (reservations.update().where(one_of(reservations.c.task_id, "b_task_ids"),
                                             reservations.c.state != "released")
                 .values(state="released", released_at=sa.bindparam("b_now")))
_INSERT_RUNS = task_runs.insert()
_NEXT_EVENT_SEQ = (task_runs.update().where(task_runs.c.id == sa.bindparam("b_task_id"))
                   .values(event_seq=task_runs.c.event_seq + 1).returning(task_runs.c.event_seq))
_INSERT_EVENTS = task_events.insert()
_FINISH_FIELDS = ("error", "result_text", "result_json", "usage_json", "changed_files", "last_rseq", "resume_handle",
                  "started_at", "event_seq")
_finish_statements: dict[tuple[str, ...], sa.Update] = {}


def _finish_statement(fields: tuple[str, ...]) -> sa.Update:
    """The UPDATE that finishes an active run writing `fields` besides its status (one per set of fields given)."""
    stmt = _finish_statements.get(fields)
    if stmt is None:
        stmt = (task_runs.update().where(task_runs.c.id == sa.bindparam("b_task_id"),
                                         among(task_runs.c.status, ACTIVE_VALUES))
                .values(status=sa.bindparam("b_status"), outcome=sa.bindparam("b_status"),
                        finished_at=sa.bindparam("b_now"), **{f: sa.bindparam(f"b_{f}") for f in fields}))
        _finish_statements[fields] = stmt
    return stmt


@dataclass(frozen=True, kw_only=True)
class QueuedTask:
    """A task admitted with its frozen snapshot, to be inserted queued."""

    task_id: str
    owner_id: str
    name: str | None
    prompt: str
    snapshot: dict[str, Any]
    now: datetime
    parent_session_id: str | None = None
    parent_turn_id: str | None = None


def event_rows(task_id: str, events: list[tuple[str, dict[str, Any]]], now: datetime, *,
               event_seq: int) -> list[dict[str, Any]]:
    """The rows of `events` (type, payload) of one run, numbered after its `event_seq`."""
    return [{"task_id": task_id, "seq": event_seq + i, "type": type_, "payload": payload, "created_at": now}
            for i, (type_, payload) in enumerate(events, start=1)]


class SqlTaskStore:
    """Task runs (`task_runs`), their events (`task_events`) and answered permission requests."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def ping(self, conn: Connection) -> None:
        """Answer a trivial query, or raise: readiness means the store answers."""
        await conn.execute(sa.text("SELECT 1"))

    async def lock_principal(self, conn: Connection, principal_id: str) -> None:
        """Hold the principal's row until the transaction ends, so its concurrent submissions count one after
        another on PostgreSQL (SQLite's writers are serialized already)."""
        await conn.execute(self.db.for_update(sa.select(principals.c.id).where(principals.c.id == principal_id)))

    async def count_queued(self, conn: Connection, owner_id: str, at_most: int | None = None) -> int:
        """Count the principal's runs still queued (tasks and turns alike), reading no more than `at_most` of them
        (a limit check needs to know only whether the limit is reached)."""
        rows = sa.select(task_runs.c.id).where(task_runs.c.owner_id == owner_id,
                                               task_runs.c.status == Status.QUEUED.value)
        if at_most is not None:
            rows = rows.limit(at_most)
        return int((await conn.execute(sa.select(sa.func.count()).select_from(rows.subquery()))).scalar_one())

    @staticmethod
    async def insert_queued_many(conn: Connection, tasks: list[QueuedTask]) -> None:
        """Insert queued tasks, each with its frozen snapshot, attempt 0 and no events yet (event_seq and last_rseq
        0), with one statement."""
        if tasks:
            await execute_many(conn, _INSERT_RUNS, [dict(
                id=t.task_id, owner_id=t.owner_id, name=t.name, prompt=t.prompt, snapshot=t.snapshot,
                status=Status.QUEUED.value, attempt=0, event_seq=0, last_rseq=0, created_at=t.now,
                parent_session_id=t.parent_session_id, parent_turn_id=t.parent_turn_id) for t in tasks])

    async def get(self, conn: Connection, task_id: str) -> TaskRunRecord | None:
        """Return the run (task or turn) with every column, or None."""
        return record(TaskRunRecord,
                      (await conn.execute(sa.select(task_runs).where(task_runs.c.id == task_id))).mappings().first())

    async def firing_of(self, conn: Connection, task_id: str) -> FiringRef | None:
        """Return the schedule firing that admitted the task, or None: a firing records the task it created, and
        creates at most one."""
        return record(FiringRef, (await conn.execute(sa.select(firings.c.id, firings.c.schedule_id)
                                                     .where(firings.c.task_id == task_id).limit(1))).mappings().first())

    async def get_for_update(self, conn: Connection, task_id: str) -> TaskRunRecord | None:
        """Return the run locked until the transaction ends (PostgreSQL), or None."""
        stmt = self.db.for_update(sa.select(task_runs).where(task_runs.c.id == task_id))
        return record(TaskRunRecord, (await conn.execute(stmt)).mappings().first())

    async def list_tasks(self, conn: Connection, owner_id: str, limit: int) -> list[TaskLine]:
        """Return the owner's `limit` most recent tasks (never turns), newest first."""
        return records(TaskLine, (await conn.execute(
            sa.select(task_runs.c.id, task_runs.c.name, task_runs.c.status, task_runs.c.created_at)
            .where(task_runs.c.owner_id == owner_id, task_runs.c.kind == "task")
            .order_by(task_runs.c.created_at.desc()).limit(limit)
        )).mappings())

    async def events_after(self, conn: Connection, task_id: str, cursor: int, limit: int) -> list[TaskEventRecord]:
        """Return up to `limit` events with `seq` > `cursor`, in sequence order."""
        return records(TaskEventRecord, (await conn.execute(
            sa.select(task_events.c.seq, task_events.c.type, task_events.c.payload, task_events.c.created_at)
            .where(task_events.c.task_id == task_id, task_events.c.seq > cursor)
            .order_by(task_events.c.seq).limit(limit)
        )).mappings())

    async def append_event(self, conn: Connection, task_id: str, type_: str, payload: dict[str, Any],
                           now: datetime) -> int:
        """Append one event numbered right after the run's `event_seq` and advance it; return the new seq. The
        counter moves first (`UPDATE … RETURNING`, which also takes the run's row lock on PostgreSQL), then the
        event is inserted: two statements; the (task, seq) pair is unique besides."""
        seq = int((await conn.execute(_NEXT_EVENT_SEQ, {"b_task_id": task_id})).scalar_one())
        await conn.execute(task_events.insert().values(task_id=task_id, seq=seq, type=type_, payload=payload,
                                                       created_at=now))
        return seq

    @staticmethod
    async def insert_event_rows(conn: Connection, rows: list[dict[str, Any]]) -> None:
        """Insert event rows (`event_rows`) of any runs, in one statement; the runs' own counters are written apart
        (`mark_events_seen`, or with its outcome by `finish`)."""
        await execute_many(conn, _INSERT_EVENTS, rows)

    @staticmethod
    async def mark_events_seen(conn: Connection, task_id: str, *, event_seq: int, last_rseq: int, usage: Any) -> None:
        """Store the run's event_seq, the last runner sequence applied (resends at or below it are skipped) and its
        usage snapshot."""
        await conn.execute(_RUNNER_EVENTS_SEEN, {"b_task_id": task_id, "b_event_seq": event_seq,
                                                 "b_last_rseq": last_rseq, "b_usage_json": usage})

    async def request_cancel(self, conn: Connection, task_id: str, now: datetime) -> None:
        """Mark a running task's cancellation as requested; its runner is told on its next outgoing round."""
        await conn.execute(task_runs.update().where(task_runs.c.id == task_id).values(cancel_requested_at=now))

    @staticmethod  # static: `finish_task` callers hold only a connection, and this rule needs no dialect switch
    async def finish(conn: Connection, task_id: str, status: Status, now: datetime, *, error: str | None = None,
                     result_text: str | None = None, result_json: Any = None, usage: Any = None,
                     changed_files: Any = None, last_rseq: int | None = None,
                     resume_handle: str | None = None, started_at: datetime | None = None,
                     event_seq: int | None = None, release: bool = True) -> bool:
        """Move an active run to terminal `status` (outcome = status; only the fields given are written: a run
        that started and ended within one batch of reports also gets its `started_at` and `event_seq` here), then
        release its reservation, whatever its state — the task row first, the order every writer takes the two in;
        False, with nothing written, when it was already terminal. With `release=False` the caller releases it
        later in the same transaction (`release_reservations`, one statement for a batch of runs)."""
        given = {key: val for key, val in zip(_FINISH_FIELDS, (error, result_text, result_json, usage, changed_files,
                                                               last_rseq, resume_handle, started_at, event_seq))
                 if val is not None}
        res = await conn.execute(_finish_statement(tuple(given)),
                                 {"b_task_id": task_id, "b_status": status.value, "b_now": now,
                                  **{f"b_{k}": v for k, v in given.items()}})
        if res.rowcount == 0:
            return False
        if release:
            await conn.execute(_RELEASE, {"b_task_id": task_id, "b_now": now})
        return True

    @staticmethod
    async def correct_lost(conn: Connection, task_id: str, status: Status, now: datetime, *, error: str | None,
                           result_text: str, result_json: Any, usage: Any, changed_files: Any,
                           lost_error: str) -> bool:
        """Replace the unknown outcome of a run ended because its runtime was lost (error `lost_error`) with the one
        its runner reported when it came back; False, with nothing written, when the run ended otherwise."""
        res = await conn.execute(task_runs.update().where(
            task_runs.c.id == task_id, task_runs.c.status == Status.FAILED.value, task_runs.c.error == lost_error)
            .values(status=status.value, outcome=status.value, error=error, result_text=result_text,
                    result_json=result_json, usage_json=usage, changed_files=changed_files, finished_at=now))
        return res.rowcount > 0

    @staticmethod
    async def release_reservations(conn: Connection, task_ids: Collection[str], now: datetime) -> None:
        """Release the reservations of runs ended in this transaction (their task rows written first), whatever
        their state, in one statement."""
        if task_ids:
            await conn.execute(_RELEASE_MANY, {"b_task_ids": sorted(set(task_ids)), "b_now": now})

    async def permission_requests(self, conn: Connection, task_id: str) -> list[dict[str, Any]]:
        """Return the payloads of the run's `permission` events (what its engine asked), in no set order."""
        return [r.payload for r in await conn.execute(sa.select(task_events.c.payload).where(
            task_events.c.task_id == task_id, task_events.c.type == "permission"))]

    async def permission_answer(self, conn: Connection, task_id: str, request_id: str) -> bool | None:
        """Return whether request `request_id` of the run was allowed, or None while it is unanswered."""
        row = (await conn.execute(sa.select(permission_replies.c.allow).where(
            permission_replies.c.task_id == task_id, permission_replies.c.request_id == request_id))).first()
        return None if row is None else bool(row.allow)

    async def record_permission_answer(self, conn: Connection, task_id: str, request_id: str, allow: bool,
                                       message: str, now: datetime) -> None:
        """Store the one answer to a permission request, unsent (a second answer to it violates the key)."""
        await conn.execute(permission_replies.insert().values(
            task_id=task_id, request_id=request_id, allow=allow, message=message, created_at=now))

    async def count_by_status(self, conn: Connection) -> dict[str, int]:
        """Count runs (tasks and turns) per status; statuses without runs are absent."""
        return {status: int(n) for status, n in (await conn.execute(
            sa.select(task_runs.c.status, sa.func.count()).group_by(task_runs.c.status))).all()}
