"""Interactive Sessions and their Turns (conversation submissions: not TaskRuns, not in Task history)."""
from __future__ import annotations

from typing import Awaitable, Callable

from ...clock import Clock, iso
from ...domain import memory as memory_rules
from ...domain.pages import MAX_SESSIONS, page_limit
from ...domain.tasks import Status, is_terminal
from ...errors import Invalid, NotFound
from ...ids import new_id
from ...store.db import Connection, Database
from ...store.questions import SqlQuestionStore
from ...store.ports.sessions import SessionStore
from ...store.records import SessionRecord
from ...store.sessions import NewRun, NewSession, SqlSessionStore
from ..tasks.admission import Admission, SubmitRequest
from ..auth.service import Caller
from ..notify import Notifier, task_key
from ..tasks.questions import answerable, chosen_answer, question_view
from ..tasks.service import TaskService


class SessionService:
    """Create Sessions, submit Turns into them and read their outcomes."""

    def __init__(self, db: Database, clock: Clock, notifier: Notifier, admission: Admission, tasks: TaskService,
                 on_admitted: Callable[[], None] | None = None, user_isolation: bool = True) -> None:
        self.db = db
        self.store: SessionStore = SqlSessionStore(db)
        self.questions = SqlQuestionStore(db)
        self.clock = clock
        self.notifier = notifier
        self.admission = admission
        self.tasks = tasks
        self.on_admitted = on_admitted or (lambda: None)
        self.user_isolation = user_isolation

    async def create(self, caller: Caller, *, name: str | None = None, profile: str | None = None,
                     model: str | None = None, reasoning_effort: str | None = None, runtime: str | None = None,
                     permission_policy: str | None = None, extra_args: list[str] | None = None,
                     source: str = "cli", kind: str = "interactive", conn: Connection | None = None) -> dict:
        """Create a Session with its engine, current model and effort resolved like a Task's."""
        if name is not None and (not isinstance(name, str) or not name.strip() or len(name) > 200
                                 or name.startswith("ses_")):
            raise Invalid("session name must be 1–200 characters and must not start with ses_")
        req = SubmitRequest(prompt="", profile=profile, runtime=runtime, model=model, extra_args=extra_args,
                            timeout_s=None, name=name, reasoning_effort=reasoning_effort,
                            permission_policy=permission_policy)
        if conn is not None:
            return await self._create(conn, caller, req, name, source, kind)
        async with self.db.write() as c:
            return await self._create(c, caller, req, name, source, kind)

    async def _create(self, conn: Connection, caller: Caller, req: SubmitRequest, name: str | None, source: str,
                      kind: str) -> dict:
        if name is not None:
            taken = await self.store.id_by_name(conn, caller.principal_id, name)
            if taken:
                raise Invalid(f"you already have a session named {name!r} ({taken}); pick another name or use it")
        snapshot = await self.admission.freeze(conn, caller, req, origin="session")
        sid = new_id("ses")
        runtime_id = await self.store.runtime_id(conn, snapshot["runtime"]) if snapshot.get("runtime") else None
        await self.store.create(conn, NewSession(
            id=sid, name=name, owner_id=caller.principal_id, kind=kind, source=source, engine=snapshot["engine"],
            model=snapshot["model"], reasoning_effort=snapshot["reasoning_effort"], snapshot=snapshot,
            runtime_id=runtime_id, memory_scope=memory_rules.precondition(caller.principal_id, self.user_isolation)),
            self.clock.now())
        return {"session_id": sid, "name": name, "engine": snapshot["engine"], "model": snapshot["model"],
                "reasoning_effort": snapshot["reasoning_effort"]}

    async def resolve_ref(self, caller: Caller, ref: str | None) -> str:
        """Resolve a session-ref (id or name) to one of the caller's sessions (the CLI supplies AMUX_SESSION_ID)."""
        ref = (ref or "").strip()
        if not ref:
            raise Invalid("no session-ref: pass a session id or name (session_list or `amux session list` shows "
                          "yours), or set AMUX_SESSION_ID")
        async with self.db.read() as conn:
            ids = await self.store.ids_by_ref(conn, caller.principal_id, ref)
        if not ids:
            raise NotFound(f"no session {ref!r} of yours (it does not exist or belongs to another user); "
                           f"session_list (`amux session list`) shows yours, or create one with "
                           f"`amux session create --name {ref}`")
        if len(ids) > 1:
            raise Invalid(f"session-ref {ref!r} names {len(ids)} sessions ({', '.join(ids)}); use the id")
        return ids[0]

    async def readable_id(self, caller: Caller, ref: str | None) -> str:
        """Resolve a session-ref the caller may read: one of its own; for an admin also any session's exact id."""
        try:
            return await self.resolve_ref(caller, ref)
        except NotFound:
            sid = (ref or "").strip()
            if caller.admin:
                async with self.db.read() as conn:
                    if await self.store.get(conn, sid) is not None:
                        return sid
            raise

    async def list(self, caller: Caller, limit: int = 50) -> list[dict]:
        """Return the caller's own sessions, most recently updated first (like tasks, an admin lists only theirs)."""
        async with self.db.read() as conn:
            rows = await self.store.owned(conn, caller.principal_id, page_limit(limit, MAX_SESSIONS, "sessions"))
        return [{"session_id": r.id, "name": r.name, "kind": r.kind, "source": r.source, "engine": r.engine,
                 "model": r.model, "reasoning_effort": r.reasoning_effort, "runtime": r.runtime, "turns": r.turns,
                 "resume_handle": r.resume_handle, "created_at": iso(r.created_at), "updated_at": iso(r.updated_at)}
                for r in rows]

    async def send(self, caller: Caller, ref: str | None, text: str, *, source: str,
                   wait_s: float | None = None) -> dict:
        """Send a Turn into one of the caller's own sessions; with `wait_s`, wait that long for its outcome.

        A Turn runs as its session's owner, so nobody (an admin included) sends into another user's session:
        the ref resolves among the caller's sessions only, and the refusal names session_list.
        """
        sid = await self.resolve_ref(caller, ref)
        turn_id = await self.submit_turn(caller, sid, text, source=source,
                                         receipt={"label": caller.label} if caller.label else None)
        if wait_s is None:
            return {"session_id": sid, "turn_id": turn_id, "status": "queued"}
        return await self.wait_turn(caller, turn_id, wait_s)

    async def _session(self, conn: Connection, caller: Caller, session_id: str) -> SessionRecord:
        row = await self.store.get(conn, session_id, lock=True)
        if row is None or (row.owner_id != caller.principal_id and not caller.admin):
            raise NotFound(f"no session {session_id!r} of yours; `amux session create` makes one")
        return row

    async def submit_turn(self, caller: Caller, session_id: str, prompt: str, source: str = "cli",
                          receipt: dict | None = None) -> str:
        """Add a Turn: it wakes the agent and runs on the session's (sticky) runtime; returns the turn id.

        `receipt` is the exact authenticated origin of this Turn (for a Feishu message: app, binding, open id,
        message id); it is frozen on the Turn and is what a schedule created during the Turn attributes to.
        """
        async with self.db.write() as conn:
            turn_id = await self.submit_turn_in(conn, caller, session_id, prompt, source=source, receipt=receipt)
        self.on_admitted()
        return turn_id

    async def submit_turn_in(self, conn: Connection, caller: Caller, session_id: str, prompt: str,
                             source: str = "cli", receipt: dict | None = None) -> str:
        """`submit_turn` in the caller's transaction (the caller wakes placement, `on_admitted`, after commit)."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise Invalid("the message is empty; send some text")
        s = await self._session(conn, caller, session_id)
        self.admission.check_prompt(s.engine, prompt)
        turn_id = await self.add_run(conn, s, prompt, kind="turn", source=source,
                                     receipt={"source": source, **(receipt or {})})
        waiting = await self.questions.waiting(conn, s.id)
        if waiting is not None:  # the next Turn of a session answers the question its last Turn ended on
            await self.questions.answer(conn, waiting.id, prompt, turn_id, self.clock.now())
        return turn_id

    async def answer_question(self, caller: Caller, question_id: str, *, option: int | None = None,
                              text: str | None = None, source: str = "cli", receipt: dict | None = None,
                              also: Callable[[Connection, str], Awaitable[None]] | None = None) -> dict:
        """Answer a waiting question (an option's index, or free text) as the next Turn of its session.

        The Turn resumes the provider conversation (the session's resume handle). A question takes one answer: a
        second one, or one after its Turn was cancelled, raises QuestionClosed with nothing changed. `also` runs
        in the same transaction with the new Turn's id (the chat flow records its progress card there).
        """
        async with self.db.write() as conn:
            q = await answerable(self.questions, conn, question_id, caller.principal_id, caller.admin)
            s = await self._session(conn, caller, q.session_id)
            q = await answerable(self.questions, conn, question_id, caller.principal_id, caller.admin)  # under lock
            answer = chosen_answer(q, option, text)
            turn_id = await self.add_run(conn, s, answer, kind="turn", source=source,
                                         receipt={"source": source, **(receipt or {}), "question_id": q.id})
            await self.questions.answer(conn, q.id, answer, turn_id, self.clock.now())
            if also is not None:
                await also(conn, turn_id)
        self.on_admitted()
        return {"question_id": q.id, "session_id": s.id, "turn_id": turn_id, "answer": answer,
                "question": question_view(q)}

    async def add_run(self, conn: Connection, s: SessionRecord, prompt: str, *, kind: str, source: str,
                      instance_id: str | None = None, snapshot: dict | None = None, name: str | None = None,
                      receipt: dict | None = None) -> str:
        """Queue a run in session `s` (a Turn, or an instance's TaskRun) on its frozen identity and sticky runtime.

        `s` is the session row read locked in this transaction (`_session`, or the instance's lock).
        """
        snap = dict(snapshot or s.snapshot)
        if s.runtime_id:
            snap["runtime"] = await self.store.runtime_name(conn, s.runtime_id)
        snap["resume_handle"] = s.resume_handle
        snap["workspace_key"] = s.id
        if receipt is not None:
            snap["receipt"] = receipt
        run_id = new_id("turn" if kind == "turn" else "tr")
        await self.store.queue_run(conn, s, NewRun(id=run_id, kind="turn" if kind == "turn" else "task", prompt=prompt,
                                                   snapshot=snap, name=name, instance_id=instance_id),
                                   self.clock.now())
        return run_id

    async def turn_outcome(self, turn_id: str) -> str | None:
        """Return the Turn's canonical terminal outcome, or None while it runs."""
        async with self.db.read() as conn:
            status = await self.store.run_status(conn, turn_id)
        if status is None:
            raise NotFound(f"turn {turn_id!r} does not exist")
        if status == Status.WAITING_FOR_USER:
            # The prompt was delivered and the agent answered with a question for the attached UI (seed: direct
            # Sessions leave questions to their UI, scheduled prompts included): the Turn itself succeeded.
            return Status.SUCCEEDED.value
        return status if is_terminal(status) else None

    async def get_turn(self, caller: Caller, turn_id: str) -> dict:
        """Return a Turn's view (status, outcome, result, events cursor)."""
        async with self.db.read() as conn:
            row = await self.store.turn(conn, turn_id)
            if row is None or (row.owner_id != caller.principal_id and not caller.admin):
                raise NotFound(f"turn {turn_id!r} does not exist or is not yours")
            view = (await self.tasks.view_of(conn, row)).wire()
            question = question_view(await self.questions.of_turn(conn, turn_id))
        if question is not None:
            view["question"] = question
        view["turn_id"] = view.pop("task_id")
        view["session_id"] = row.session_id
        view["seq"] = row.turn_seq
        return view

    async def turn_view(self, conn: Connection, turn_id: str) -> dict | None:
        """Return a Turn's view (as `get_turn`) in the caller's transaction, for the hub's own flows (no caller:
        the chat flow shows its owner's Turn on the owner's card); None when there is no such Turn."""
        row = await self.store.turn(conn, turn_id)
        if row is None:
            return None
        view = (await self.tasks.view_of(conn, row)).wire()
        question = question_view(await self.questions.of_turn(conn, turn_id))
        if question is not None:
            view["question"] = question
        view["turn_id"] = view.pop("task_id")
        view["session_id"] = row.session_id
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
            s = await self.store.get(conn, session_id)
            if s is None or (s.owner_id != caller.principal_id and not caller.admin):
                raise NotFound(f"no session {session_id!r} of yours")
            rows = await self.store.recent_runs(conn, session_id, turns)
            runtime = await self.store.runtime_name(conn, s.runtime_id)
            question = question_view(await self.questions.waiting(conn, session_id))
        return {"session_id": s.id, "name": s.name, "kind": s.kind, "engine": s.engine, "model": s.model,
                "reasoning_effort": s.reasoning_effort, "runtime": runtime, "resume_handle": s.resume_handle,
                "turns": [{"id": r.id, "seq": r.turn_seq, "kind": r.kind, "status": r.status, "result": r.result_text}
                          for r in rows], "created_at": iso(s.created_at), "updated_at": iso(s.updated_at),
                "question": question}
