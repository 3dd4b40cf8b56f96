"""Sessions and the runs queued in them (Turns, and an instance's owner TaskRuns)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from ..domain.tasks import Status
from .db import Connection, Database
from .records import SessionLine, SessionRecord, SessionRun, TaskRunRecord, record, records
from .tables import runtimes, sessions, task_runs


@dataclass(frozen=True, kw_only=True)
class NewSession:
    """A session as it is created: frozen identity, sticky runtime (if the admission chose one), no runs yet."""

    id: str
    name: str | None
    owner_id: str
    kind: str
    source: str
    engine: str
    model: str | None
    reasoning_effort: str | None
    snapshot: dict[str, Any]
    runtime_id: str | None
    memory_scope: str | None


@dataclass(frozen=True, kw_only=True)
class NewRun:
    """A run to queue in a session: a Turn (`kind` "turn") or an instance's owner TaskRun (`kind` "task")."""

    id: str
    kind: str
    prompt: str
    snapshot: dict[str, Any]
    name: str | None = None
    instance_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class DelegationParent:
    """The session a delegation from an amux-session token belongs to, and its running Turn."""

    session_id: str
    active_turn_id: str | None
    engine: str
    model: str | None
    reasoning_effort: str | None


class SqlSessionStore:
    """Sessions, their numbered runs and their sticky runtime, in SQL."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def id_by_name(self, conn: Connection, owner_id: str, name: str) -> str | None:
        """Return the id of the owner's session called `name`, or None (a name is the owner's alone)."""
        return (await conn.execute(sa.select(sessions.c.id).where(
            sessions.c.owner_id == owner_id, sessions.c.name == name))).scalar()

    async def ids_by_ref(self, conn: Connection, owner_id: str, ref: str) -> list[str]:
        """Return the ids of the owner's sessions whose id or name is `ref` (other owners' sessions never match)."""
        rows = (await conn.execute(sa.select(sessions.c.id).where(
            sessions.c.owner_id == owner_id, sa.or_(sessions.c.id == ref, sessions.c.name == ref))
            .order_by(sessions.c.id))).all()
        return [r.id for r in rows]

    async def runtime_id(self, conn: Connection, runtime_name: str) -> str | None:
        """Return the id of the runtime named `runtime_name` a new session sticks to, or None when none has it."""
        return (await conn.execute(sa.select(runtimes.c.id).where(runtimes.c.name == runtime_name))).scalar()

    async def runtime_name(self, conn: Connection, runtime_id: str | None) -> str | None:
        """Return the name of a session's sticky runtime, or None when it has none (yet) or it is gone."""
        if not runtime_id:
            return None
        return (await conn.execute(sa.select(runtimes.c.name).where(runtimes.c.id == runtime_id))).scalar()

    async def create(self, conn: Connection, new: NewSession, now: datetime) -> None:
        """Insert a session with no runs (`turns` 0), created and updated at `now`."""
        await conn.execute(sessions.insert().values(
            id=new.id, name=new.name, owner_id=new.owner_id, kind=new.kind, source=new.source, engine=new.engine,
            model=new.model, reasoning_effort=new.reasoning_effort, snapshot=new.snapshot, runtime_id=new.runtime_id,
            turns=0, created_at=now, updated_at=now, memory_scope=new.memory_scope))

    async def get(self, conn: Connection, session_id: str, *, lock: bool = False) -> SessionRecord | None:
        """Return the session, or None; with `lock`, hold its row to the transaction's end (writers queue up)."""
        stmt = sa.select(sessions).where(sessions.c.id == session_id)
        result = await conn.execute(self.db.for_update(stmt) if lock else stmt)
        return record(SessionRecord, result.mappings().first())

    async def owned(self, conn: Connection, owner_id: str, limit: int) -> list[SessionLine]:
        """Return up to `limit` of the owner's sessions (never another owner's), most recently updated first.

        Each line carries the session's columns but its snapshot, and `runtime`, its sticky runtime's name (None
        when it has none or it is gone); ties in `updated_at` go newest id first, so pages are stable.
        """
        stmt: sa.Select[Any] = (
            sa.select(sessions.c.id, sessions.c.name, sessions.c.kind, sessions.c.source, sessions.c.engine,
                      sessions.c.model, sessions.c.reasoning_effort, sessions.c.turns, sessions.c.resume_handle,
                      sessions.c.created_at, sessions.c.updated_at, runtimes.c.name.label("runtime"))
            .select_from(sessions.outerjoin(runtimes, runtimes.c.id == sessions.c.runtime_id))
            .where(sessions.c.owner_id == owner_id)
            .order_by(sessions.c.updated_at.desc(), sessions.c.id.desc()).limit(limit))
        return records(SessionLine, (await conn.execute(stmt)).mappings())

    async def queue_run(self, conn: Connection, session: SessionRecord, run: NewRun, now: datetime) -> int:
        """Queue `run` as the session's next run (seq `turns + 1`, the session's owner and parent); return the seq.

        `session` is the one read with `lock` in this transaction, so the seqs of one session never repeat or skip.
        """
        seq: int = session.turns + 1
        await conn.execute(task_runs.insert().values(
            id=run.id, owner_id=session.owner_id, name=run.name, prompt=run.prompt, snapshot=run.snapshot,
            status=Status.QUEUED.value, attempt=0, event_seq=0, last_rseq=0, created_at=now, kind=run.kind,
            session_id=session.id, turn_seq=seq, instance_id=run.instance_id,
            parent_session_id=session.parent_session_id, result_json=None))
        await conn.execute(sessions.update().where(sessions.c.id == session.id).values(turns=seq, updated_at=now))
        return seq

    async def run_status(self, conn: Connection, run_id: str) -> str | None:
        """Return the status of the run `run_id` (a Turn or a TaskRun), or None when there is no such run."""
        return (await conn.execute(sa.select(task_runs.c.status).where(task_runs.c.id == run_id))).scalar()

    async def turn(self, conn: Connection, turn_id: str) -> TaskRunRecord | None:
        """Return the Turn's run, or None: a TaskRun's id names no Turn."""
        return record(TaskRunRecord, (await conn.execute(sa.select(task_runs).where(
            task_runs.c.id == turn_id, task_runs.c.kind == "turn"))).mappings().first())

    async def recent_runs(self, conn: Connection, session_id: str, limit: int) -> list[SessionRun]:
        """Return the session's last `limit` runs (id, seq, kind, status, result text), newest seq first."""
        stmt: sa.Select[Any] = (
            sa.select(task_runs.c.id, task_runs.c.turn_seq, task_runs.c.status, task_runs.c.result_text,
                      task_runs.c.kind)
            .where(task_runs.c.session_id == session_id).order_by(task_runs.c.turn_seq.desc()).limit(limit))
        return records(SessionRun, (await conn.execute(stmt)).mappings())

    @staticmethod
    async def delegation_parent(conn: Connection, session_id: str, owner_id: str) -> DelegationParent | None:
        """Return the owner's session with its running run of highest seq; None when it is not the owner's.

        A delegation never takes another owner's session as its parent. Static: it takes no lock, so a caller
        holding only a connection (`hub.services.tasks.delegation.delegation_parent`) can use it.
        """
        s = (await conn.execute(sa.select(sessions.c.engine, sessions.c.model, sessions.c.reasoning_effort).where(
            sessions.c.id == session_id, sessions.c.owner_id == owner_id))).first()
        if s is None:
            return None
        active = (await conn.execute(sa.select(task_runs.c.id).where(
            task_runs.c.session_id == session_id, task_runs.c.status == Status.RUNNING.value)
            .order_by(task_runs.c.turn_seq.desc()).limit(1))).scalar()
        return DelegationParent(session_id=session_id, active_turn_id=active, engine=s.engine, model=s.model,
                                reasoning_effort=s.reasoning_effort)
