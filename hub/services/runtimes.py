"""The hub's side of the runner protocol: registration, reconciliation, events and outcomes."""
from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa

from ..clock import Clock
from ..domain.events import project
from ..domain.tasks import Status, is_terminal
from ..errors import Conflict, Invalid
from ..ids import new_id
from ..runner import protocol as p
from ..store.db import Database
from ..store.tables import reservations, runtimes, task_events, task_runs
from .auth import Caller
from .dispatch import Dispatcher
from .notify import Notifier
from .tasks import finish_task, task_key

log = logging.getLogger("amux.runtimes")
NOT_YOURS = "runner reported task {task} which this runtime does not hold (attempt {attempt}); it was dropped — nothing to do"


class RuntimeService:
    """Apply runner messages to the store; every method is idempotent under resends."""

    def __init__(self, db: Database, clock: Clock, notifier: Notifier, dispatcher: Dispatcher,
                 on_started=None) -> None:  # noqa: ANN001
        self.db = db
        self.clock = clock
        self.notifier = notifier
        self.dispatcher = dispatcher
        self.on_started = on_started or (lambda task_id, latency: None)

    async def register(self, caller: Caller, msg: p.Register) -> tuple[str, str, list[str]]:
        """Upsert the runtime, mark it online under a new connection, reconcile held work."""
        if msg.protocol != p.PROTOCOL_VERSION:
            raise Invalid(f"runner protocol {msg.protocol} is not supported (hub speaks {p.PROTOCOL_VERSION}); upgrade amux on the runner")
        now = self.clock.now()
        conn_id = new_id("conn")
        held = {w.task_id: w.attempt for w in msg.running}
        drop: list[str] = []
        caps = dict(msg.capabilities)
        async with self.db.write() as conn:
            row = (await conn.execute(self.db.for_update(sa.select(runtimes).where(runtimes.c.name == msg.name)))).first()
            if row is not None and row.principal_id != caller.principal_id and not caller.admin:
                raise Conflict(f"runtime name {msg.name!r} belongs to another principal; start the runner with another --name")
            values = dict(capabilities=caps, slots=msg.slots, status="online", connection_id=conn_id, last_seen_at=now)
            if row is None:
                rt_id = new_id("rt")
                await conn.execute(runtimes.insert().values(
                    id=rt_id, name=msg.name, principal_id=caller.principal_id, shared=caller.admin,
                    registered_at=now, **values))
            else:
                rt_id = row.id
                await conn.execute(runtimes.update().where(runtimes.c.id == rt_id).values(**values))
            mine = (await conn.execute(sa.select(task_runs.c.id, task_runs.c.status, task_runs.c.attempt).where(
                task_runs.c.runtime_id == rt_id,
                task_runs.c.status.in_([Status.DISPATCHED.value, Status.RUNNING.value])))).all()
            for t in mine:
                if held.get(t.id) == t.attempt:
                    continue
                if t.status == Status.RUNNING.value:
                    await finish_task(conn, t.id, Status.FAILED, now,
                                      error="runtime lost: the runner restarted without this task; resubmit it")
                else:  # dispatched but never started: send it again on this connection
                    await conn.execute(reservations.update().where(
                        reservations.c.task_id == t.id, reservations.c.state == "pending").values(sent_at=None))
            for task_id, attempt in held.items():
                t = (await conn.execute(sa.select(task_runs.c.runtime_id, task_runs.c.attempt, task_runs.c.status)
                                        .where(task_runs.c.id == task_id))).first()
                if t is None or t.runtime_id != rt_id or t.attempt != attempt:
                    drop.append(task_id)
        self.dispatcher.kick()
        return rt_id, conn_id, drop

    async def heartbeat(self, runtime_id: str, conn_id: str) -> None:
        """Record that the runner is alive on this connection."""
        async with self.db.write() as conn:
            await conn.execute(runtimes.update().where(runtimes.c.id == runtime_id, runtimes.c.connection_id == conn_id)
                               .values(last_seen_at=self.clock.now(), status="online"))

    async def disconnected(self, runtime_id: str, conn_id: str) -> None:
        """Mark the runtime offline; its tasks wait for a reconnect until the lost timeout."""
        async with self.db.write() as conn:
            await conn.execute(runtimes.update().where(runtimes.c.id == runtime_id, runtimes.c.connection_id == conn_id)
                               .values(status="offline", connection_id=None))

    async def _owned(self, conn, runtime_id: str, task_id: str, attempt: int) -> Any:  # noqa: ANN001
        row = (await conn.execute(self.db.for_update(sa.select(task_runs).where(task_runs.c.id == task_id)))).first()
        if row is None or row.runtime_id != runtime_id or row.attempt != attempt:
            return None
        return row

    async def accepted(self, runtime_id: str, msg: p.Accepted) -> str:
        """Commit the reservation and mark the task running; return 'ok', 'cancel' or 'drop'."""
        now = self.clock.now()
        async with self.db.write() as conn:
            row = await self._owned(conn, runtime_id, msg.task_id, msg.attempt)
            if row is None:
                return "drop"
            if is_terminal(row.status):
                return "cancel"
            if row.status == Status.DISPATCHED.value:
                await conn.execute(task_runs.update().where(task_runs.c.id == row.id)
                                   .values(status=Status.RUNNING.value, started_at=now))
                await conn.execute(reservations.update().where(
                    reservations.c.task_id == row.id, reservations.c.attempt == msg.attempt,
                    reservations.c.state == "pending").values(state="committed"))
                from ..clock import utc
                self.on_started(row.id, (now - utc(row.created_at)).total_seconds())
        self.notifier.notify(task_key(msg.task_id))
        return "cancel" if row.cancel_requested_at is not None else "ok"

    async def events(self, runtime_id: str, msg: p.Events) -> int | None:
        """Append new events in order; return the acknowledged runner sequence, None when not ours."""
        now = self.clock.now()
        async with self.db.write() as conn:
            row = await self._owned(conn, runtime_id, msg.task_id, msg.attempt)
            if row is None:
                return None
            seq, last = row.event_seq, row.last_rseq
            usage = row.usage_json
            rows = []
            for ev in msg.events:
                if ev.rseq <= last:
                    continue
                last = ev.rseq
                payload = project(ev.type, ev.payload)
                if payload is None:
                    continue
                if ev.type == "usage":
                    if payload["usage"] == usage:
                        continue  # equal snapshots are deduplicated
                    usage = payload["usage"]
                seq += 1
                rows.append({"task_id": row.id, "seq": seq, "type": ev.type, "payload": payload, "created_at": now})
            if rows:
                await conn.execute(task_events.insert(), rows)
            if last != row.last_rseq:
                await conn.execute(task_runs.update().where(task_runs.c.id == row.id)
                                   .values(event_seq=seq, last_rseq=last, usage_json=usage))
        if rows:
            self.notifier.notify(task_key(msg.task_id))
        return last

    async def finished(self, runtime_id: str, msg: p.Finished) -> bool:
        """Record the terminal outcome and release capacity; False when the task is not this runner's."""
        now = self.clock.now()
        async with self.db.write() as conn:
            row = await self._owned(conn, runtime_id, msg.task_id, msg.attempt)
            if row is None:
                return False
            if not is_terminal(row.status):
                await finish_task(conn, row.id, Status(msg.outcome), now, error=msg.error,
                                  result_text=msg.result_text, result_json=msg.result_json,
                                  usage=msg.usage or row.usage_json, changed_files=msg.changed_files)
                await conn.execute(task_runs.update().where(task_runs.c.id == row.id).values(last_rseq=msg.rseq))
        self.notifier.notify(task_key(msg.task_id))
        self.dispatcher.kick()
        return True

    async def outgoing(self, runtime_id: str, conn_id: str, cancels_sent: set[str]) -> list[dict]:
        """Return dispatches and cancels this connection should send now (and mark dispatches sent)."""
        now = self.clock.now()
        out: list[dict] = []
        async with self.db.write() as conn:
            current = (await conn.execute(sa.select(runtimes.c.connection_id).where(runtimes.c.id == runtime_id))).scalar()
            if current != conn_id:
                return out
            pending = (await conn.execute(
                sa.select(reservations.c.id, task_runs.c.id.label("task_id"), task_runs.c.attempt,
                          task_runs.c.prompt, task_runs.c.snapshot)
                .join(task_runs, task_runs.c.id == reservations.c.task_id)
                .where(reservations.c.runtime_id == runtime_id, reservations.c.state == "pending",
                       reservations.c.sent_at.is_(None), task_runs.c.status == Status.DISPATCHED.value))).all()
            if pending:
                await conn.execute(reservations.update().where(reservations.c.id.in_([r.id for r in pending]))
                                   .values(sent_at=now))
            cancels = (await conn.execute(sa.select(task_runs.c.id).where(
                task_runs.c.runtime_id == runtime_id, task_runs.c.status == Status.RUNNING.value,
                task_runs.c.cancel_requested_at.is_not(None)))).all()
        for r in pending:
            out.append(p.Dispatch(task_id=r.task_id, attempt=r.attempt, prompt=r.prompt, snapshot=r.snapshot).model_dump())
        for c in cancels:
            if c.id not in cancels_sent:
                cancels_sent.add(c.id)
                out.append(p.Cancel(task_id=c.id).model_dump())
        return out
