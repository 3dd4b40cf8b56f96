"""Interactive Sessions and their Turns (conversation submissions: not TaskRuns, not in Task history)."""
from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from ..clock import Clock
from ..domain import memory as memory_rules
from ..domain.tasks import Status, is_terminal
from ..errors import Invalid, NotFound
from ..ids import new_id
from ..store.db import Database
from ..store.tables import runtimes, sessions, task_runs
from .admission import Admission, SubmitRequest
from .auth import Caller
from .notify import Notifier
from .tasks import TaskService, _iso, task_key



class SessionService:
    """Create Sessions, submit Turns into them and read their outcomes."""

    def __init__(self, db: Database, clock: Clock, notifier: Notifier, admission: Admission, tasks: TaskService,
                 on_admitted=None, user_isolation: bool = False) -> None:  # noqa: ANN001
        self.db = db
        self.clock = clock
        self.notifier = notifier
        self.admission = admission
        self.tasks = tasks
        self.on_admitted = on_admitted or (lambda: None)
        self.user_isolation = user_isolation

    async def create(self, caller: Caller, *, name: str | None = None, profile: str | None = None,
                     model: str | None = None, reasoning_effort: str | None = None, runtime: str | None = None,
                     permission_policy: str | None = None, extra_args: list[str] | None = None,
                     source: str = "cli", kind: str = "interactive", conn=None) -> dict:  # noqa: ANN001
        """Create a Session with its engine, current model and effort resolved like a Task's."""
        if name is not None and (not isinstance(name, str) or not name.strip() or len(name) > 200
                                 or name.startswith("ses_")):
            raise Invalid("session name must be 1–200 characters and must not start with ses_")
        req = SubmitRequest("", profile, runtime, model, extra_args, None, name, reasoning_effort, permission_policy)
        if conn is not None:
            return await self._create(conn, caller, req, name, source, kind)
        async with self.db.write() as c:
            return await self._create(c, caller, req, name, source, kind)

    async def _create(self, conn, caller: Caller, req: SubmitRequest, name, source: str, kind: str) -> dict:  # noqa: ANN001
        if name is not None:
            taken = (await conn.execute(sa.select(sessions.c.id).where(
                sessions.c.owner_id == caller.principal_id, sessions.c.name == name))).first()
            if taken:
                raise Invalid(f"you already have a session named {name!r} ({taken.id}); pick another name or use it")
        snapshot = await self.admission.freeze(conn, caller, req, origin="session")
        now = self.clock.now()
        sid = new_id("ses")
        runtime_id = None
        if snapshot.get("runtime"):
            runtime_id = (await conn.execute(sa.select(runtimes.c.id).where(runtimes.c.name == snapshot["runtime"]))).scalar()
        await conn.execute(sessions.insert().values(
            id=sid, name=name, owner_id=caller.principal_id, kind=kind, source=source, engine=snapshot["engine"],
            model=snapshot["model"], reasoning_effort=snapshot["reasoning_effort"], snapshot=snapshot,
            runtime_id=runtime_id, turns=0, created_at=now, updated_at=now,
            memory_scope=memory_rules.precondition(caller.principal_id, self.user_isolation)))
        return {"session_id": sid, "name": name, "engine": snapshot["engine"], "model": snapshot["model"],
                "reasoning_effort": snapshot["reasoning_effort"]}

    async def resolve_ref(self, caller: Caller, ref: str | None) -> str:
        """Resolve a session-ref (id or name) to one of the caller's sessions (the CLI supplies AMUX_SESSION_ID)."""
        ref = (ref or "").strip()
        if not ref:
            raise Invalid("no session-ref: pass a session id or name, or set AMUX_SESSION_ID")
        async with self.db.read() as conn:
            rows = (await conn.execute(sa.select(sessions.c.id).where(
                sessions.c.owner_id == caller.principal_id, sa.or_(sessions.c.id == ref, sessions.c.name == ref)))).all()
        if not rows:
            raise NotFound(f"no session {ref!r} of yours; create one with `amux session create --name {ref}`")
        if len(rows) > 1:
            raise Invalid(f"session-ref {ref!r} names {len(rows)} sessions ({', '.join(r.id for r in rows)}); use the id")
        return rows[0].id

    async def _session(self, conn, caller: Caller, session_id: str) -> Any:  # noqa: ANN001
        row = (await conn.execute(self.db.for_update(sa.select(sessions).where(sessions.c.id == session_id)))).first()
        if row is None or (row.owner_id != caller.principal_id and not caller.admin):
            raise NotFound(f"no session {session_id!r} of yours; `amux session create` makes one")
        return row

    async def submit_turn(self, caller: Caller, session_id: str, prompt: str, source: str = "cli",
                          receipt: dict | None = None) -> str:
        """Add a Turn: it wakes the agent and runs on the session's (sticky) runtime; returns the turn id.

        `receipt` is the exact authenticated origin of this Turn (for a Feishu message: app, binding, open id,
        message id); it is frozen on the Turn and is what a schedule created during the Turn attributes to.
        """
        if not isinstance(prompt, str) or not prompt.strip():
            raise Invalid("the message is empty; send some text")
        async with self.db.write() as conn:
            s = await self._session(conn, caller, session_id)
            self.admission.check_prompt(s.engine, prompt)
            turn_id = await self.add_run(conn, s, prompt, kind="turn", source=source,
                                         receipt={"source": source, **(receipt or {})})
        self.on_admitted()
        return turn_id

    async def add_run(self, conn, s: Any, prompt: str, *, kind: str, source: str,  # noqa: ANN001
                      instance_id: str | None = None, snapshot: dict | None = None, name: str | None = None,
                      receipt: dict | None = None) -> str:
        """Queue a run in session `s` (a Turn, or an instance's TaskRun) on its frozen identity and sticky runtime."""
        now = self.clock.now()
        seq = s.turns + 1
        snap = dict(snapshot or s.snapshot)
        if s.runtime_id:
            snap["runtime"] = (await conn.execute(sa.select(runtimes.c.name).where(runtimes.c.id == s.runtime_id))).scalar()
        snap["resume_handle"] = s.resume_handle
        snap["workspace_key"] = s.id
        if receipt is not None:
            snap["receipt"] = receipt
        run_id = new_id("turn" if kind == "turn" else "tr")
        await conn.execute(task_runs.insert().values(
            id=run_id, owner_id=s.owner_id, name=name, prompt=prompt, snapshot=snap, status=Status.QUEUED.value,
            attempt=0, event_seq=0, last_rseq=0, created_at=now, kind="turn" if kind == "turn" else "task",
            session_id=s.id, turn_seq=seq, instance_id=instance_id,
            parent_session_id=s.parent_session_id, result_json=None))
        await conn.execute(sessions.update().where(sessions.c.id == s.id).values(turns=seq, updated_at=now))
        return run_id

    async def turn_outcome(self, turn_id: str) -> str | None:
        """Return the Turn's canonical terminal outcome, or None while it runs."""
        async with self.db.read() as conn:
            row = (await conn.execute(sa.select(task_runs.c.status).where(task_runs.c.id == turn_id))).first()
        if row is None:
            raise NotFound(f"turn {turn_id!r} does not exist")
        return row.status if is_terminal(row.status) else None

    async def get_turn(self, caller: Caller, turn_id: str) -> dict:
        """Return a Turn's view (status, outcome, result, events cursor)."""
        async with self.db.read() as conn:
            row = (await conn.execute(sa.select(task_runs).where(task_runs.c.id == turn_id, task_runs.c.kind == "turn"))).first()
            if row is None or (row.owner_id != caller.principal_id and not caller.admin):
                raise NotFound(f"turn {turn_id!r} does not exist or is not yours")
            view = await self.tasks._view(conn, row)
        view["turn_id"] = view.pop("task_id")
        view["session_id"] = row.session_id
        view["seq"] = row.turn_seq
        return view

    async def wait_turn(self, caller: Caller, turn_id: str, timeout_s: float | None = None) -> dict:
        """Block until the Turn is terminal (or the timeout); never cancels it."""
        import time

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            view = await self.get_turn(caller, turn_id)
            if is_terminal(view["status"]) or (deadline is not None and time.monotonic() >= deadline):
                return view
            await self.notifier.wait(task_key(turn_id), 1.0)

    async def show(self, caller: Caller, session_id: str, turns: int = 20) -> dict:
        """Return a Session with its most recent Turns."""
        async with self.db.read() as conn:
            s = (await conn.execute(sa.select(sessions).where(sessions.c.id == session_id))).first()
            if s is None or (s.owner_id != caller.principal_id and not caller.admin):
                raise NotFound(f"no session {session_id!r} of yours")
            rows = (await conn.execute(sa.select(task_runs.c.id, task_runs.c.turn_seq, task_runs.c.status,
                                                 task_runs.c.result_text, task_runs.c.kind)
                                       .where(task_runs.c.session_id == session_id)
                                       .order_by(task_runs.c.turn_seq.desc()).limit(turns))).all()
            runtime = (await conn.execute(sa.select(runtimes.c.name).where(runtimes.c.id == s.runtime_id))).scalar() if s.runtime_id else None
        return {"session_id": s.id, "name": s.name, "kind": s.kind, "engine": s.engine, "model": s.model,
                "reasoning_effort": s.reasoning_effort, "runtime": runtime, "resume_handle": s.resume_handle,
                "turns": [{"id": r.id, "seq": r.turn_seq, "kind": r.kind, "status": r.status, "result": r.result_text}
                          for r in rows], "created_at": _iso(s.created_at), "updated_at": _iso(s.updated_at)}
