"""The hub's side of the runner protocol: registration, reconciliation, events and outcomes."""
from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from datetime import datetime
from types import SimpleNamespace
from typing import Any, Awaitable, Callable, TypeVar

from pydantic import BaseModel

from ..clock import Clock, utc
from ..config import ExecutionSettings
from ..domain import isolation
from ..domain import memory as memory_rules
from ..domain.events import clean_usage, project
from ..domain.timeline import raw_payload
from ..domain.tasks import RUNTIME_LOST, Status, is_terminal
from ..errors import AmuxError, Conflict, Forbidden, Invalid, NotFound
from ..ids import new_id
from ..runner import protocol as p
from ..store.db import Connection, Database, Row
from ..store.execution_uids import SqlExecutionUidStore
from ..store.runtimes import RegistrationRace, SqlRuntimeStore
from ..store.tasks import SqlTaskStore, event_rows
from ..store.timeline import SqlTimelineStore, timeline_rows
from .auth import AuthService, Caller, RunToken
from .credentials import CredentialService
from .dispatch import Dispatcher
from .notify import Notifier
from .questions import record_question
from .tasks import task_key

T = TypeVar("T")
Current = dict[str, tuple[str | None, dict[str, Any]]]
"""Each runtime's current connection id and capabilities, by runtime id."""
log = logging.getLogger("amux.runtimes")


@dataclass
class _Effects:
    """What a batch changed, acted on after its transaction commits."""

    changed: set[str] = field(default_factory=set)
    started: list[tuple[str, float]] = field(default_factory=list)
    freed: bool = False
    # The runs this transaction read and locked, as this batch has changed them: a batch often carries several
    # reports of one run (accepted, events, finished), and the run is read once (None: not this runtime's).
    held: dict[tuple[str, int], SimpleNamespace | None] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)  # event rows not inserted yet (`event_rows`)
    timeline: list[dict[str, Any]] = field(default_factory=list)  # Agent Timeline rows not inserted yet
    stale: set[tuple[str, int]] = field(default_factory=set)  # reports of attempts that no longer hold their task
    # Runs the batch ended (their reservations released and run tokens revoked by `_write_pending`, one statement
    # each for the batch), and those of them whose task row it wrote terminal.
    ended: set[str] = field(default_factory=set)
    finished: set[str] = field(default_factory=set)


def run_label(session_id: str | None, task_id: str | None) -> str:
    """The label of a run token: `amux-session:<id>` for a session's runs (delegations and memory key on it),
    `run:<task id>` otherwise."""
    return f"amux-session:{session_id}" if session_id else f"run:{task_id}"


def _pending(row: Row) -> SimpleNamespace:
    """A held run as a batch changes it: `start_pending` / `seen_dirty` are the run's start and event counters the
    batch has yet to write (with its outcome if it also finishes in this batch, else by `_write_pending`)."""
    return SimpleNamespace(**row._asdict(), start_pending=None, seen_dirty=False)


TAKEN = ("runtime name {name!r} belongs to {owner!r}, who registered it first; start the runner with another "
         "--name, or have {owner!r} deregister it (`DELETE /api/v1/runtimes/{name}` with their token) while its "
         "runner is stopped")
BOUND = ("runtime name {name!r} is bound to the runner token that registered it, and this is another token; start "
         "this runner with another --name, or free the name first: `amux runtime deregister {name}` (the owner, or "
         "an admin: `DELETE /api/v1/runtimes/{name}`) while its runner is stopped")
REVOKED = ("this runner's token was revoked; the connection is closed: create a new one with "
           "`amux token create --runner`")


@dataclass
class _Due:
    """What one connection is due this round: messages in sending order, and the runs to cancel."""

    messages: list[dict] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class Link:
    """One runner connection a replica serves: its runtime, connection id, token, and the cancels sent on it."""

    runtime_id: str
    conn_id: str
    token_id: str | None = None
    cancels_sent: set[str] = field(default_factory=set)


@dataclass(frozen=True, kw_only=True)
class Outbound:
    """What one pump round hands the connections: messages per connection id, and the connections to close —
    revoked (their token), or stale (no longer their runtime's current connection: the runtime was marked lost,
    or its runner registered again elsewhere)."""

    messages: dict[str, list[dict]]
    revoked: set[str]
    stale: set[str] = field(default_factory=set)


class TokenRevoked(Forbidden):
    """The connection's token was revoked: send nothing more on it."""


NOT_YOURS = ("runner reported task {task}, which this runtime does not hold; the report was refused and nothing "
             "changed — the runner drops the task (it was reassigned, finished or never dispatched here)")


class RuntimeService:
    """Apply runner messages to the store; every method is idempotent under resends."""

    def __init__(self, db: Database, clock: Clock, notifier: Notifier, dispatcher: Dispatcher,
                 credentials: CredentialService, auth: AuthService | None = None, hub_url: str = "",
                 on_started: Callable[[str, float], None] | None = None,
                 execution: ExecutionSettings | None = None) -> None:
        self.db = db
        self.execution = execution or ExecutionSettings()
        self.uids = SqlExecutionUidStore()
        self.store = SqlRuntimeStore(db)
        self.tasks = SqlTaskStore(db)
        self.clock = clock
        self.notifier = notifier
        self.dispatcher = dispatcher
        self.credentials = credentials
        self.auth = auth
        self.hub_url = hub_url
        self.on_started = on_started or (lambda task_id, latency: None)

    async def register(self, caller: Caller, msg: p.Register) -> tuple[str, str, list[str]]:
        """Upsert the runtime, mark it online under a new connection, reconcile held work.

        A runtime name belongs to the principal that registered it first: anyone else (an admin
        included) is refused until the owner deregisters it. Within that principal it is bound to the token
        that registered it: another live token is refused (`BOUND`) until the owner or an admin deregisters
        it, so a second runner cannot take over its dispatches. Runtimes registered with an admin's runner
        token (or an admin token) are shared.
        """
        if msg.protocol != p.PROTOCOL_VERSION:
            raise Invalid(f"runner protocol {msg.protocol} is not supported (hub speaks {p.PROTOCOL_VERSION}); "
                          "upgrade amux on the runner")
        # Two first registrations of one name race on PostgreSQL: the loser registers again and sees the winner's row.
        for attempt in (1, 2):
            try:
                registered = await self.db.transaction(lambda conn: self._register(conn, caller, msg))
                break
            except RegistrationRace:
                if attempt == 2:
                    raise
        self.dispatcher.kick()
        return registered

    async def _register(self, conn: Connection, caller: Caller, msg: p.Register) -> tuple[str, str, list[str]]:
        now = self.clock.now()
        conn_id = new_id("conn")
        held = {w.task_id: w.attempt for w in msg.running}
        drop: list[str] = []
        caps = isolation.admit_process(dict(msg.capabilities), socket.gethostname(), os.geteuid(),
                                       self.execution.allow_process_on_hub)
        shared = caller.shared or caller.admin
        row = await self.store.by_name(conn, msg.name, lock=True)
        if row is not None and row.principal_id != caller.principal_id:
            owner = await self.store.owner_name(conn, row.principal_id)
            raise Conflict(TAKEN.format(name=msg.name, owner=owner))
        if row is not None and not await self._may_bind(conn, row, caller):
            raise Conflict(BOUND.format(name=msg.name))
        rt_id = await self.store.register(conn, runtime_id=row.id if row is not None else None, name=msg.name,
                                          principal_id=caller.principal_id, capabilities=caps, slots=msg.slots,
                                          shared=shared, connection_id=conn_id, now=now, token_id=caller.token_id)
        for t in await self.store.runs_on(conn, rt_id):
            if held.get(t.id) == t.attempt:
                continue
            if t.status == Status.RUNNING.value:
                await self.tasks.finish(conn, t.id, Status.FAILED, now,
                                        error="runtime lost: the runner restarted without this task; resubmit it")
            else:  # dispatched but never started: send it again on this connection
                await self.store.resend_dispatch(conn, t.id)
        for task_id, attempt in held.items():
            placed = await self.store.placement_of(conn, task_id)
            if placed is None or placed.runtime_id != rt_id or placed.attempt != attempt:
                drop.append(task_id)
            elif is_terminal(placed.status) and placed.error != RUNTIME_LOST:
                drop.append(task_id)  # ended here already; a run ended as lost keeps it, to hear what happened
        return rt_id, conn_id, drop

    async def _may_bind(self, conn: Connection, row: Row, caller: Caller) -> bool:
        """Whether the owner's token `caller` may serve runtime `row`: the token that registered it, or any when none
        is bound (a runtime from before 0017) or the bound one was revoked (a rotated token)."""
        if row.token_id is None or row.token_id == caller.token_id:
            return True
        return not await self.store.runner_token_live(conn, row.token_id)

    async def deregister(self, caller: Caller, name: str) -> dict:
        """Free a runtime name (and its token binding): its owner or an admin, only while its runner is stopped and
        it holds no work."""

        async def deregister(conn: Connection) -> None:
            row = await self.store.by_name(conn, name, lock=True)
            if row is None or (row.principal_id != caller.principal_id and not caller.admin):
                raise NotFound(f"you own no runtime named {name!r}; list runtimes with `GET /api/v1/runtimes`")
            if row.status == "online":
                raise Conflict(f"runtime {name!r} is online; stop its runner first, then deregister it")
            busy = await self.store.open_reservations(conn, row.id)
            if busy:
                raise Conflict(f"runtime {name!r} still holds {busy} reservation(s); "
                               "wait for its tasks to end or expire")
            await self.store.delete(conn, row.id)

        await self.db.transaction(deregister)
        return {"name": name, "deregistered": True}

    async def list_runtimes(self) -> list[dict]:
        """Return every registered runtime by name: id, name, status, slots, capabilities."""
        async with self.db.read() as conn:
            rows = await self.store.list_all(conn)
        return [{"id": x.id, "name": x.name, "status": x.status, "slots": x.slots, "capabilities": x.capabilities}
                for x in rows]

    async def disconnected(self, runtime_id: str, conn_id: str) -> None:
        """Mark the runtime offline; its tasks wait for a reconnect until the lost timeout."""
        await self.db.transaction(lambda conn: self.store.mark_offline(conn, runtime_id, conn_id))

    async def apply(self, runtime_id: str, conn_id: str, messages: list[BaseModel]) -> list[dict]:
        """Apply a batch of runner messages in one transaction, in order; return the replies to send.

        One transaction per batch is what keeps the store from being the bottleneck: a runner flushes
        everything it produced in one loop turn (accepts, events, outcomes of several tasks) as one batch.
        """
        now = self.clock.now()
        fx, replies = await self.db.transaction(lambda conn: self._apply(conn, runtime_id, conn_id, messages, now))
        for task_id, latency in fx.started:
            self.on_started(task_id, latency)
        for task_id in fx.changed:
            self.notifier.notify(task_key(task_id))
        if fx.freed:
            self.dispatcher.kick()
        refused = [p.ErrorMsg(message=NOT_YOURS.format(task=r["task_id"])).model_dump()
                   for r in replies if r["type"] == "ack" and r["drop"]]
        return replies + refused

    async def _apply(self, conn: Connection, runtime_id: str, conn_id: str, messages: list[BaseModel],
                     now: datetime) -> tuple[_Effects, list[dict]]:
        """Apply the batch in the caller's transaction; return its effects and replies (fresh on each attempt)."""
        fx = _Effects()
        replies: list[dict] = []
        await self._hold_all(conn, runtime_id, messages, fx)
        for msg in messages:
            if isinstance(msg, p.Heartbeat):
                await self.store.heartbeat(conn, runtime_id, conn_id, now)
            elif isinstance(msg, p.Accepted):
                verdict = await self._accepted(conn, runtime_id, msg, now, fx)
                replies.append(p.Ack(task_id=msg.task_id, rseq=0, drop=verdict == "drop").model_dump())
                if verdict == "cancel":
                    replies.append(p.Cancel(task_id=msg.task_id).model_dump())
            elif isinstance(msg, p.Events):
                last = await self._events(conn, runtime_id, msg, now, fx)
                replies.append(p.Ack(task_id=msg.task_id, rseq=last or 0, drop=last is None).model_dump())
            elif isinstance(msg, p.Finished):
                ok = await self._finished(conn, runtime_id, msg, now, fx)
                replies.append(p.Ack(task_id=msg.task_id, rseq=msg.rseq, drop=not ok).model_dump())
            elif isinstance(msg, p.Steered):
                # Taken by the running turn, or back to the mailbox for a later wake.
                await self.store.settle_steer(conn, msg.steer_id, msg.task_id, msg.delivered, now,
                                              note=msg.reason)
            if isinstance(msg, (p.Events, p.Finished)) and fx.held.get((msg.task_id, msg.attempt)) is None:
                fx.stale.add((msg.task_id, msg.attempt))
        await self._record_stale(conn, runtime_id, fx, now)
        await self._write_pending(conn, fx, now)
        return fx, replies

    async def _record_stale(self, conn: Connection, runtime_id: str, fx: _Effects, now: datetime) -> None:
        """Record, on the task, each report of an attempt that no longer holds it: dropped, never applied."""
        for task_id, attempt in sorted(fx.stale):
            placed = await self.store.placement_of(conn, task_id)
            if placed is None:
                continue
            log.warning("dropped a report of task %s attempt %d from runtime %s: that attempt no longer holds it "
                        "(the task is at attempt %s, %s)", task_id, attempt, runtime_id, placed.attempt, placed.status)
            note = {"text": f"a report from attempt {attempt} (runtime {runtime_id}) was dropped: that attempt no "
                            f"longer holds this task"}
            live = next((r for (t, _), r in fx.held.items() if t == task_id and r is not None), None)
            if live is None:
                await self.tasks.append_event(conn, task_id, "warning", note, now)
            else:  # the live attempt's events of this batch are numbered after it
                fx.events += event_rows(task_id, [("warning", note)], now, event_seq=live.event_seq)
                live.event_seq, live.seen_dirty = live.event_seq + 1, True

    async def heartbeat(self, runtime_id: str, conn_id: str) -> None:
        """Record that the runner is alive on this connection."""
        await self.apply(runtime_id, conn_id, [p.Heartbeat()])

    async def accepted(self, runtime_id: str, msg: p.Accepted) -> str:
        """Apply one Accepted; return 'ok', 'cancel' or 'drop'."""
        return await self._single(self._accepted, runtime_id, msg)

    async def events(self, runtime_id: str, msg: p.Events) -> int | None:
        """Apply one Events; return the acknowledged runner sequence, None when not ours."""
        return await self._single(self._events, runtime_id, msg)

    async def finished(self, runtime_id: str, msg: p.Finished) -> bool:
        """Apply one Finished; False when the task is not this runner's."""
        return await self._single(self._finished, runtime_id, msg)

    async def _single(self, handler: Callable[..., Awaitable[T]], runtime_id: str, msg: BaseModel) -> T:
        """Apply one report in a transaction of its own (what it left pending written before the commit)."""
        now = self.clock.now()

        async def apply(conn: Connection) -> T:
            fx = _Effects()
            out = await handler(conn, runtime_id, msg, now, fx)
            await self._write_pending(conn, fx, now)
            return out

        return await self.db.transaction(apply)

    async def _held(self, conn: Connection, runtime_id: str, task_id: str, attempt: int,
                    fx: _Effects) -> SimpleNamespace | None:
        """The run this report is about, read (and locked) once per transaction; None when this runtime does not
        hold this attempt of it."""
        key = (task_id, attempt)
        if key not in fx.held:
            row = await self.store.held_run(conn, runtime_id, task_id, attempt)
            fx.held[key] = None if row is None else _pending(row)
        return fx.held[key]

    async def _hold_all(self, conn: Connection, runtime_id: str, messages: list[BaseModel], fx: _Effects) -> None:
        """Read (and lock) every run the batch reports on in one statement, as `_held` would one by one."""
        keys = {(m.task_id, m.attempt) for m in messages if isinstance(m, (p.Accepted, p.Events, p.Finished))}
        rows = await self.store.held_runs(conn, {task_id for task_id, _ in keys})
        for task_id, attempt in keys:
            row = rows.get(task_id)
            ours = row is not None and row.runtime_id == runtime_id and row.attempt == attempt
            fx.held[(task_id, attempt)] = _pending(row) if ours else None

    async def _write_pending(self, conn: Connection, fx: _Effects, now: datetime) -> None:
        """Write what the batch's reports left pending: their events (one statement for the batch); for the runs it
        ended, the release of their reservations and the revocation of their run tokens (one statement each for the
        batch, after their task rows: the order every writer takes them in); and on runs that did not finish in it
        their start (the task row, then its reservation) and their event counters."""
        await self.tasks.insert_event_rows(conn, fx.events)
        await SqlTimelineStore.insert(conn, fx.timeline)
        fx.events, fx.timeline = [], []
        await self.tasks.release_reservations(conn, fx.finished, now)
        if self.auth is not None:
            await self.auth.revoke_runs(conn, fx.ended)  # the children's AMUX_TOKENs end with their runs
        fx.finished, fx.ended = set(), set()
        for (_, attempt), row in fx.held.items():
            if row is None:
                continue
            if row.start_pending is not None:
                await self.store.start_run(conn, row.id, attempt, row.start_pending)
            if row.seen_dirty:
                await self.tasks.mark_events_seen(conn, row.id, event_seq=row.event_seq, last_rseq=row.last_rseq,
                                                  usage=row.usage_json)

    async def _accepted(self, conn: Connection, runtime_id: str, msg: p.Accepted, now: datetime,
                        fx: _Effects) -> str:
        """Commit the reservation and mark the task running."""
        row = await self._held(conn, runtime_id, msg.task_id, msg.attempt, fx)
        if row is None:
            return "drop"
        if is_terminal(row.status):
            return "cancel"
        if row.status == Status.DISPATCHED.value:
            row.status, row.start_pending = Status.RUNNING.value, now  # written at the end of the batch
            fx.started.append((row.id, (now - utc(row.created_at)).total_seconds()))
            if row.session_id:  # the session's runtime is sticky from its first run
                await self.store.stick_session(conn, row.session_id, runtime_id)
        fx.changed.add(row.id)
        return "cancel" if row.cancel_requested_at is not None else "ok"

    async def _events(self, conn: Connection, runtime_id: str, msg: p.Events, now: datetime,
                      fx: _Effects) -> int | None:
        """Append new events in order (resends are skipped by the runner sequence)."""
        row = await self._held(conn, runtime_id, msg.task_id, msg.attempt, fx)
        if row is None:
            return None
        last = row.last_rseq
        usage = row.usage_json
        new: list[tuple[str, dict[str, Any]]] = []
        raw: list[tuple[int, str, Any]] = []
        for ev in msg.events:
            if ev.rseq <= last:
                continue
            last = ev.rseq
            if ev.type != "usage":  # the Agent Timeline: what the agent did, raw (secrets cut); usage is the run's
                raw.append((ev.rseq, ev.type, raw_payload(ev.payload)))
            payload = project(ev.type, ev.payload)
            if payload is None:
                continue
            if ev.type == "usage":
                if payload["usage"] == usage:
                    continue  # equal snapshots are deduplicated
                usage = payload["usage"]
            new.append((ev.type, payload))
        if new:
            fx.changed.add(row.id)
        fx.timeline += timeline_rows(row.id, raw, now)
        if last != row.last_rseq:  # new events, or resends skipped up to a later runner sequence
            fx.events += event_rows(row.id, new, now, event_seq=row.event_seq)  # inserted at the end of the batch
            row.event_seq, row.last_rseq, row.usage_json = row.event_seq + len(new), last, usage
            row.seen_dirty = True  # the counters are written once per batch
        return last

    async def _finished(self, conn: Connection, runtime_id: str, msg: p.Finished, now: datetime,
                        fx: _Effects) -> bool:
        """Record the terminal outcome and release capacity."""
        row = await self._held(conn, runtime_id, msg.task_id, msg.attempt, fx)
        if row is None:
            return False
        if row.status == Status.FAILED.value and row.error == RUNTIME_LOST and msg.outcome != "waiting_for_user":
            # The runtime was declared lost while this attempt ran, and its runner came back with the real outcome.
            if await self.tasks.correct_lost(conn, row.id, Status(msg.outcome), now, error=msg.error,
                                             result_text=msg.result_text, result_json=msg.result_json,
                                             usage=clean_usage(msg.usage) or row.usage_json,
                                             changed_files=msg.changed_files, lost_error=RUNTIME_LOST):
                note = {"text": f"the runner came back after its runtime was declared lost and reported "
                                f"{msg.outcome}; this record now says what happened"}
                fx.events += event_rows(row.id, [("status", note)], now, event_seq=row.event_seq)
                row.event_seq, row.seen_dirty = row.event_seq + 1, True
                fx.changed.add(row.id)
            row.status, row.last_rseq = msg.outcome, msg.rseq
            return True
        if not is_terminal(row.status):
            status, error = Status(msg.outcome), msg.error
            if status == Status.WAITING_FOR_USER and (row.kind != "turn" or msg.question is None):
                status, error = Status.FAILED, p.QUESTION_DIAGNOSTIC  # only a direct Session's Turn waits
            if await self.tasks.finish(conn, row.id, status, now, error=error,
                                       result_text=msg.result_text, result_json=msg.result_json,
                                       usage=clean_usage(msg.usage) or row.usage_json,
                                       changed_files=msg.changed_files, last_rseq=msg.rseq,
                                       resume_handle=msg.resume_handle, started_at=row.start_pending,
                                       event_seq=row.event_seq if row.seen_dirty else None, release=False):
                fx.finished.add(row.id)  # its reservation is released by `_write_pending`
            row.status, row.last_rseq, row.start_pending, row.seen_dirty = status.value, msg.rseq, None, False
            if status == Status.WAITING_FOR_USER and msg.question is not None:
                await record_question(conn, row, msg.question, now)
            if row.session_id and msg.resume_handle:
                await self.store.record_resume_handle(conn, row.session_id, msg.resume_handle, now)
            fx.freed = True
        fx.ended.add(row.id)  # its run token is revoked by `_write_pending`
        fx.changed.add(row.id)
        return True

    async def coordination_env(self, conn: Connection, owner_id: str, session_id: str | None,
                               task_id: str | None = None, *, direct: bool = True,
                               first_attempt: bool = False) -> dict[str, str]:
        """What a task child needs to reach the hub: its address, a run token (and its session's id, if any).

        The token is the run's own (kind `run`, bound to `task_id`; without one, the session's running
        turn), labeled `amux-session:<id>` for a session's runs (delegations and memory key on it),
        `run:<task id>` otherwise; it is revoked when the run ends. Only a direct Session's Turn (`direct`) is
        told AMUX_SESSION_ID, which is what gives its agent the hub's MCP tools: an instance's runs are task
        children (memory CLI, no recursive task MCP tools), though their token still names their session.
        """
        if task_id is None and session_id:
            task_id = await self.store.current_run_of_session(conn, session_id)
        token = await self.auth.mint_run(conn, owner_id, task_id, run_label(session_id, task_id), first=first_attempt)
        return self._coordination(token, session_id, direct)

    def _coordination(self, token: str, session_id: str | None, direct: bool) -> dict[str, str]:
        """The environment `coordination_env` gives a task child holding `token`."""
        env = {"AMUX_HUB_URL": self.hub_url, "AMUX_TOKEN": token}
        if session_id and direct:
            env["AMUX_SESSION_ID"] = session_id
        return env

    async def _bind_memory(self, conn: Connection, r: Row, caps: dict, now: datetime) -> None:
        """Bind the run's memory at launch; warn (never fall back) without the capability.

        A fresh session binds its stored scope precondition at its first launch (kept on resume); a run outside any
        session resolves its scope with its effective principal, the run token's, when it calls (MemoryService).
        """
        if r.session_id is None:
            if not caps.get("memory_cli"):
                await self.tasks.append_event(conn, r.task_id, "warning", {
                    "text": "memory capability discovery failed on this runtime (no `amux memory` CLI); "
                            "this run has no amux memory"}, now)
            return
        stored = await self.store.memory_scope(conn, r.session_id)
        scope, warn = memory_rules.bind(stored, bool(caps.get("memory_cli")))
        if scope != stored:
            await self.store.bind_memory_scope(conn, r.session_id, scope)
        if warn:
            await self.tasks.append_event(conn, r.task_id, "warning", {
                "text": "memory capability discovery failed on this runtime (no `amux memory` CLI); "
                        "this conversation runs without amux memory"}, now)

    async def outgoing(self, runtime_id: str, conn_id: str, cancels_sent: set[str],
                       token_id: str | None = None) -> list[dict]:
        """Return dispatches and cancels this connection should send now (and mark dispatches sent).

        With `token_id` (the connection's token), a revoked token raises TokenRevoked before anything
        is sent: a revoked runner gets no dispatch from any replica once the revocation is committed.
        """
        link = Link(runtime_id=runtime_id, conn_id=conn_id, token_id=token_id, cancels_sent=cancels_sent)
        due = await self.outgoing_many([link])
        if conn_id in due.revoked:
            raise TokenRevoked(REVOKED)
        return due.messages.get(conn_id, [])

    async def outgoing_many(self, links: list[Link]) -> Outbound:
        """Return what each of these connections should send now, read for all of them in one transaction of a few
        queries (dispatches, steers, permission answers, cancels; dispatches, steers and answers marked sent).

        A connection whose token is revoked is in `revoked` and gets nothing: once a revocation is committed on any
        replica, no dispatch follows it. A connection that is no longer its runtime's current one is in `stale` and
        gets nothing (its runner must register again). Cancels are sent once per connection (`Link.cancels_sent`).
        """
        if not links:
            return Outbound(messages={}, revoked=set())
        now = self.clock.now()
        try:
            # Most rounds (a poll, a wake for a cancel) claim nothing: their reads take no write lock.
            quiet = await self._quiet(links)
            if quiet is not None:
                return self.outbound(links, *quiet)
            out, revoked = await self.db.transaction(lambda conn: self._outgoing(conn, links, now))
        except Exception:
            if len(links) == 1:
                raise
            out, revoked = await self._outgoing_each(links, now)
        return self.outbound(links, out, revoked)

    async def served(self, conn: Connection, links: list[Link], current: Current) -> dict[str, str]:
        """Of these connections, the ones that serve their runtime (token live, still its current connection, as
        `current` says): runtime id -> connection id."""
        return (await self._serving(conn, links, current))[2]

    async def dispatch_messages(self, conn: Connection, runs: list[Any], caps: dict[str, dict[str, Any]],
                                now: datetime, *, fresh: bool = False) -> list[tuple[str, dict]]:
        """Build the Dispatch message of each run (task_id, attempt, runtime_id, prompt, snapshot, owner_id,
        session_id, kind) in the caller's transaction, its reservation marked sent: its credentials, its run token
        (`coordination_env`) and its memory binding; a run whose credentials no longer resolve fails instead.
        `fresh`: the reservations were made in this transaction (placement's hand-off), so a first attempt has no
        earlier token to revoke; a dispatch sent again (a runner that registered again) always revokes.
        Return (runtime id, message) pairs, in order."""
        ready = []
        for r in runs:
            cred = r.snapshot.get("credential_profile")
            try:
                env = await self.credentials.materialize(conn, cred["name"], r.owner_id) if cred else {}
            except AmuxError as e:  # e.g. the value was deleted or the key changed since admission
                await self.tasks.finish(conn, r.task_id, Status.FAILED, now, error=e.message)
                continue
            ready.append((r, env))
        if self.auth is not None and ready:  # the round's run tokens: one revocation and one INSERT for all
            tokens = await self.auth.mint_runs(conn, [
                RunToken(r.owner_id, r.task_id, run_label(r.session_id, r.task_id), fresh and r.attempt == 1)
                for r, _ in ready])
            for (r, env), token in zip(ready, tokens):
                env.update(self._coordination(token, r.session_id, direct=r.kind == "turn"))
                await self._bind_memory(conn, r, caps.get(r.runtime_id, {}), now)
        dac = {r.owner_id for r, _ in ready if isolation.runs_as_principal(r.snapshot)}
        uids = await self.uids.of(conn, dac)
        return [(r.runtime_id, p.Dispatch(task_id=r.task_id, attempt=r.attempt, prompt=r.prompt, snapshot=r.snapshot,
                                          env=env, direct_session=r.kind == "turn",
                                          uid=uids.get(r.owner_id) if r.owner_id in dac else None).model_dump())
                for r, env in ready]

    @staticmethod
    def outbound(links: list[Link], out: dict[str, _Due], revoked: set[str]) -> Outbound:
        """What a committed claim hands the connections (cancels added once per connection)."""
        by_conn = {link.conn_id: link for link in links}
        for conn_id, due in out.items():
            sent = by_conn[conn_id].cancels_sent
            for task_id in due.cancels:
                if task_id not in sent:
                    sent.add(task_id)
                    due.messages.append(p.Cancel(task_id=task_id).model_dump())
        stale = {x.conn_id for x in links if x.conn_id not in revoked and x.conn_id not in out}
        return Outbound(messages={c: due.messages for c, due in out.items() if due.messages}, revoked=revoked,
                        stale=stale)

    async def _outgoing_each(self, links: list[Link], now: datetime) -> tuple[dict[str, _Due], set[str]]:
        """Serve each connection in a transaction of its own, after a round for all of them failed: what one
        runtime's work breaks must not starve the others. When the first two alone fail too, the database is
        the cause: raise, and the pump backs off."""
        out: dict[str, _Due] = {}
        revoked: set[str] = set()
        served = 0
        for i, link in enumerate(links):
            try:
                one, gone = await self.db.transaction(lambda conn, link=link: self._outgoing(conn, [link], now))
            except Exception:
                if i == 1 and served == 0:
                    raise
                log.exception("could not read what runtime %s is due; the others are served", link.runtime_id)
                continue
            served += 1
            out.update(one)
            revoked |= gone
        return out, revoked

    async def _serving(self, conn: Connection, links: list[Link], current: Current | None = None
                       ) -> tuple[set[str], Current, dict[str, str]]:
        """Which of these connections are revoked (their token), each runtime's current connection and capabilities
        (read unless given), and the connection each runtime is served on here (runtime id -> connection id)."""
        live = await self.store.live_tokens(conn, [x.token_id for x in links if x.token_id is not None])
        revoked = {x.conn_id for x in links if x.token_id is not None and x.token_id not in live}
        if current is None:
            current = await self.store.connections(conn, [x.runtime_id for x in links if x.conn_id not in revoked])
        serving = {x.runtime_id: x.conn_id for x in links
                   if x.conn_id not in revoked and current.get(x.runtime_id, (None, {}))[0] == x.conn_id}
        return revoked, current, serving

    async def _quiet(self, links: list[Link]) -> tuple[dict[str, _Due], set[str]] | None:
        """Read, outside any transaction, what a round owes these connections when it has nothing to claim (no
        unsent dispatch, permission answer or steer): the revoked and the stale, and the cancels. None when there is
        something to claim, which takes a write transaction."""
        async with self.db.autocommit() as conn:
            revoked, _, serving = await self._serving(conn, links)
            out = {c: _Due() for c in serving.values()}
            if not serving:
                return out, revoked
            if await self.store.claimable(conn, list(serving)):
                return None
            for c in await self.store.cancels_due(conn, list(serving)):
                out[serving[c.runtime_id]].cancels.append(c.task_id)
        return out, revoked

    async def _outgoing(self, conn: Connection, links: list[Link], now: datetime) -> tuple[dict[str, _Due], set[str]]:
        """Claim what is due on these connections in the caller's transaction: per connection id, the messages
        (dispatches, steers, permission answers) and the runs to cancel; and the connections whose token is revoked.
        Fresh on each attempt (the transaction may be run again)."""
        revoked, current, serving = await self._serving(conn, links)
        out = {c: _Due() for c in serving.values()}
        if not serving:
            return out, revoked
        ids = list(serving)
        pending = await self.store.claim_dispatches(conn, ids, now)
        cancels = await self.store.cancels_due(conn, ids)
        answers = await self.store.claim_permission_answers(conn, ids, now)
        steers = await self.store.claim_steers(conn, ids, now)
        caps = {rt: current[rt][1] for rt in serving}
        for runtime_id, msg in await self.dispatch_messages(conn, pending, caps, now):
            out[serving[runtime_id]].messages.append(msg)
        for st in steers:
            out[serving[st.runtime_id]].messages.append(
                p.Steer(task_id=st.task_id, steer_id=st.id, text=st.text).model_dump())
        for a in answers:
            out[serving[a.runtime_id]].messages.append(p.PermissionAnswer(
                task_id=a.task_id, request_id=a.request_id, allow=a.allow, message=a.message or "").model_dump())
        for c in cancels:
            out[serving[c.runtime_id]].cancels.append(c.task_id)
        return out, revoked
