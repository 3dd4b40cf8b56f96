"""The hub's side of the runner protocol: registration, reconciliation, events and outcomes."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.exc import IntegrityError

from ..clock import Clock, utc
from ..domain import memory as memory_rules
from ..domain.events import project
from ..domain.tasks import Status, is_terminal
from ..errors import AmuxError, Conflict, Forbidden, Invalid, NotFound
from ..ids import new_id
from ..runner import protocol as p
from ..store.db import Database
from ..store.tables import (api_tokens, mailbox, permission_replies, principals, reservations, runtimes, sessions,
                            task_events, task_runs)
from .auth import AuthService, Caller
from .credentials import CredentialService
from .dispatch import Dispatcher
from .notify import Notifier
from .tasks import finish_task, task_key

log = logging.getLogger("amux.runtimes")


@dataclass
class _Effects:
    """What a batch changed, acted on after its transaction commits."""

    changed: set[str] = field(default_factory=set)
    started: list[tuple[str, float]] = field(default_factory=list)
    freed: bool = False
TAKEN = ("runtime name {name!r} belongs to {owner!r}, who registered it first; start the runner with another --name, "
         "or have {owner!r} deregister it (`DELETE /api/v1/runtimes/{name}` with their token) while its runner is stopped")
REVOKED = "this runner's token was revoked; the connection is closed: create a new one with `amux token create --runner`"


class TokenRevoked(Forbidden):
    """The connection's token was revoked: send nothing more on it."""


NOT_YOURS = ("runner reported task {task}, which this runtime does not hold; the report was refused and nothing changed — "
             "the runner drops the task (it was reassigned, finished or never dispatched here)")


class RuntimeService:
    """Apply runner messages to the store; every method is idempotent under resends."""

    def __init__(self, db: Database, clock: Clock, notifier: Notifier, dispatcher: Dispatcher,
                 credentials: CredentialService, auth: AuthService | None = None, hub_url: str = "",
                 on_started=None) -> None:  # noqa: ANN001
        self.db = db
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
        included) is refused until the owner deregisters it. Runtimes registered with an admin's runner
        token (or an admin token) are shared.
        """
        if msg.protocol != p.PROTOCOL_VERSION:
            raise Invalid(f"runner protocol {msg.protocol} is not supported (hub speaks {p.PROTOCOL_VERSION}); upgrade amux on the runner")
        for attempt in (1, 2):  # two first registrations of one name race on PostgreSQL: the loser sees the winner's row
            try:
                async with self.db.write() as conn:
                    registered = await self._register(conn, caller, msg)
                break
            except IntegrityError:
                if attempt == 2:
                    raise
        self.dispatcher.kick()
        return registered

    async def _register(self, conn, caller: Caller, msg: p.Register) -> tuple[str, str, list[str]]:  # noqa: ANN001
        now = self.clock.now()
        conn_id = new_id("conn")
        held = {w.task_id: w.attempt for w in msg.running}
        drop: list[str] = []
        caps = dict(msg.capabilities)
        shared = caller.shared or caller.admin
        row = (await conn.execute(self.db.for_update(sa.select(runtimes).where(runtimes.c.name == msg.name)))).first()
        if row is not None and row.principal_id != caller.principal_id:
            owner = (await conn.execute(sa.select(principals.c.name).where(principals.c.id == row.principal_id))).scalar()
            raise Conflict(TAKEN.format(name=msg.name, owner=owner))
        values = dict(capabilities=caps, slots=msg.slots, status="online", connection_id=conn_id, last_seen_at=now,
                      shared=shared)
        if row is None:
            rt_id = new_id("rt")
            await conn.execute(runtimes.insert().values(
                id=rt_id, name=msg.name, principal_id=caller.principal_id, registered_at=now, **values))
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
        return rt_id, conn_id, drop

    async def deregister(self, caller: Caller, name: str) -> dict:
        """Free a runtime name: only its owner, only while its runner is stopped and it holds no work."""
        async with self.db.write() as conn:
            row = (await conn.execute(self.db.for_update(sa.select(runtimes).where(runtimes.c.name == name)))).first()
            if row is None or row.principal_id != caller.principal_id:
                raise NotFound(f"you own no runtime named {name!r}; list runtimes with `GET /api/v1/runtimes`")
            if row.status == "online":
                raise Conflict(f"runtime {name!r} is online; stop its runner first, then deregister it")
            busy = (await conn.execute(sa.select(sa.func.count()).select_from(reservations).where(
                reservations.c.runtime_id == row.id, reservations.c.state != "released"))).scalar()
            if busy:
                raise Conflict(f"runtime {name!r} still holds {busy} reservation(s); wait for its tasks to end or expire")
            await conn.execute(reservations.delete().where(reservations.c.runtime_id == row.id))
            await conn.execute(runtimes.delete().where(runtimes.c.id == row.id))
        return {"name": name, "deregistered": True}

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

    async def apply(self, runtime_id: str, conn_id: str, messages: list[BaseModel]) -> list[dict]:
        """Apply a batch of runner messages in one transaction, in order; return the replies to send.

        One transaction per batch is what keeps the store from being the bottleneck: a runner flushes
        everything it produced in one loop turn (accepts, events, outcomes of several tasks) as one batch.
        """
        fx = _Effects()
        replies: list[dict] = []
        now = self.clock.now()
        async with self.db.write() as conn:
            for msg in messages:
                if isinstance(msg, p.Heartbeat):
                    await conn.execute(runtimes.update().where(runtimes.c.id == runtime_id, runtimes.c.connection_id == conn_id)
                                       .values(last_seen_at=now, status="online"))
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
                    await conn.execute(mailbox.update().where(mailbox.c.id == msg.steer_id, mailbox.c.state == "pending")
                                       .values(state="delivered" if msg.delivered else "queued", settled_at=now,
                                               task_id=msg.task_id if msg.delivered else None))
        for task_id, latency in fx.started:
            self.on_started(task_id, latency)
        for task_id in fx.changed:
            self.notifier.notify(task_key(task_id))
        if fx.freed:
            self.dispatcher.kick()
        refused = [p.ErrorMsg(message=NOT_YOURS.format(task=r["task_id"])).model_dump()
                   for r in replies if r["type"] == "ack" and r["drop"]]
        return replies + refused

    async def heartbeat(self, runtime_id: str, conn_id: str) -> None:
        """Record that the runner is alive on this connection."""
        await self.apply(runtime_id, conn_id, [p.Heartbeat()])

    async def accepted(self, runtime_id: str, msg: p.Accepted) -> str:
        """Apply one Accepted; return 'ok', 'cancel' or 'drop'."""
        fx = _Effects()
        async with self.db.write() as conn:
            verdict = await self._accepted(conn, runtime_id, msg, self.clock.now(), fx)
        return verdict

    async def events(self, runtime_id: str, msg: p.Events) -> int | None:
        """Apply one Events; return the acknowledged runner sequence, None when not ours."""
        async with self.db.write() as conn:
            return await self._events(conn, runtime_id, msg, self.clock.now(), _Effects())

    async def finished(self, runtime_id: str, msg: p.Finished) -> bool:
        """Apply one Finished; False when the task is not this runner's."""
        async with self.db.write() as conn:
            return await self._finished(conn, runtime_id, msg, self.clock.now(), _Effects())

    async def _accepted(self, conn, runtime_id: str, msg: p.Accepted, now, fx: "_Effects") -> str:  # noqa: ANN001
        """Commit the reservation and mark the task running."""
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
            fx.started.append((row.id, (now - utc(row.created_at)).total_seconds()))
            if row.session_id:  # the session's runtime is sticky from its first run
                await conn.execute(sessions.update().where(sessions.c.id == row.session_id, sessions.c.runtime_id.is_(None))
                                   .values(runtime_id=runtime_id))
        fx.changed.add(row.id)
        return "cancel" if row.cancel_requested_at is not None else "ok"

    async def _events(self, conn, runtime_id: str, msg: p.Events, now, fx: "_Effects") -> int | None:  # noqa: ANN001
        """Append new events in order (resends are skipped by the runner sequence)."""
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
            fx.changed.add(row.id)
        if last != row.last_rseq:
            await conn.execute(task_runs.update().where(task_runs.c.id == row.id)
                               .values(event_seq=seq, last_rseq=last, usage_json=usage))
        return last

    async def _finished(self, conn, runtime_id: str, msg: p.Finished, now, fx: "_Effects") -> bool:  # noqa: ANN001
        """Record the terminal outcome and release capacity."""
        row = await self._owned(conn, runtime_id, msg.task_id, msg.attempt)
        if row is None:
            return False
        if not is_terminal(row.status):
            await finish_task(conn, row.id, Status(msg.outcome), now, error=msg.error,
                              result_text=msg.result_text, result_json=msg.result_json,
                              usage=msg.usage or row.usage_json, changed_files=msg.changed_files,
                              last_rseq=msg.rseq, resume_handle=msg.resume_handle)
            if row.session_id and msg.resume_handle:
                await conn.execute(sessions.update().where(sessions.c.id == row.session_id)
                                   .values(resume_handle=msg.resume_handle, updated_at=now))
            fx.freed = True
        if self.auth is not None:
            await self.auth.revoke_run(conn, row.id)  # the child's AMUX_TOKEN ends with its run
        fx.changed.add(row.id)
        return True

    async def coordination_env(self, conn, owner_id: str, session_id: str | None,  # noqa: ANN001
                               task_id: str | None = None) -> dict[str, str]:
        """What a task child needs to reach the hub: its address, a run token (and its session's id, if any).

        The token is the run's own (kind `run`, bound to `task_id`; without one, the session's running
        turn), labeled `amux-session:<id>` for a session's runs (delegations and memory key on it),
        `run:<task id>` otherwise; it is revoked when the run ends.
        """
        if task_id is None and session_id:
            task_id = (await conn.execute(sa.select(task_runs.c.id).where(
                task_runs.c.session_id == session_id, task_runs.c.status.in_(
                    [Status.RUNNING.value, Status.DISPATCHED.value])).order_by(task_runs.c.turn_seq.desc()).limit(1))).scalar()
        label = f"amux-session:{session_id}" if session_id else f"run:{task_id}"
        token = await self.auth.mint_run(conn, owner_id, task_id, label)
        env = {"AMUX_HUB_URL": self.hub_url, "AMUX_TOKEN": token}
        if session_id:
            env["AMUX_SESSION_ID"] = session_id
        return env

    async def _bind_memory(self, conn, r, caps: dict, now) -> None:  # noqa: ANN001
        """Bind a fresh session's memory scope at its first launch; warn (never fall back) without the capability."""
        stored = (await conn.execute(sa.select(sessions.c.memory_scope).where(sessions.c.id == r.session_id))).scalar()
        scope, warn = memory_rules.bind(stored, bool(caps.get("memory_cli")))
        if scope != stored:
            await conn.execute(sessions.update().where(sessions.c.id == r.session_id).values(memory_scope=scope))
        if warn:
            seq = (await conn.execute(sa.select(task_runs.c.event_seq).where(task_runs.c.id == r.task_id))).scalar() + 1
            await conn.execute(task_events.insert().values(
                task_id=r.task_id, seq=seq, type="warning", created_at=now,
                payload={"text": "memory capability discovery failed on this runtime (no `amux memory` CLI); "
                                 "this conversation runs without amux memory"}))
            await conn.execute(task_runs.update().where(task_runs.c.id == r.task_id).values(event_seq=seq))

    async def outgoing(self, runtime_id: str, conn_id: str, cancels_sent: set[str], token_id: str | None = None) -> list[dict]:
        """Return dispatches and cancels this connection should send now (and mark dispatches sent).

        With `token_id` (the connection's token), a revoked token raises TokenRevoked before anything
        is sent: a revoked runner gets no dispatch from any replica once the revocation is committed.
        """
        now = self.clock.now()
        out: list[dict] = []
        async with self.db.write() as conn:
            if token_id is not None:
                revoked = (await conn.execute(sa.select(api_tokens.c.revoked_at).where(api_tokens.c.id == token_id))).first()
                if revoked is None or revoked.revoked_at is not None:
                    raise TokenRevoked(REVOKED)
            current, caps = (await conn.execute(sa.select(runtimes.c.connection_id, runtimes.c.capabilities)
                                                 .where(runtimes.c.id == runtime_id))).one()
            if current != conn_id:
                return out
            pending = (await conn.execute(
                sa.select(reservations.c.id, task_runs.c.id.label("task_id"), task_runs.c.attempt,
                          task_runs.c.prompt, task_runs.c.snapshot, task_runs.c.owner_id, task_runs.c.session_id)
                .join(task_runs, task_runs.c.id == reservations.c.task_id)
                .where(reservations.c.runtime_id == runtime_id, reservations.c.state == "pending",
                       reservations.c.sent_at.is_(None), task_runs.c.status == Status.DISPATCHED.value))).all()
            if pending:
                await conn.execute(reservations.update().where(reservations.c.id.in_([r.id for r in pending]))
                                   .values(sent_at=now))
            cancels = (await conn.execute(sa.select(task_runs.c.id).where(
                task_runs.c.runtime_id == runtime_id, task_runs.c.status == Status.RUNNING.value,
                task_runs.c.cancel_requested_at.is_not(None)))).all()
            answers = (await conn.execute(
                sa.select(permission_replies).join(task_runs, task_runs.c.id == permission_replies.c.task_id).where(
                    task_runs.c.runtime_id == runtime_id, task_runs.c.status == Status.RUNNING.value,
                    permission_replies.c.sent_at.is_(None)))).all()
            for a in answers:
                await conn.execute(permission_replies.update().where(
                    permission_replies.c.task_id == a.task_id, permission_replies.c.request_id == a.request_id)
                    .values(sent_at=now))
            for r in pending:
                cred = r.snapshot.get("credential_profile")
                try:
                    env = await self.credentials.materialize(conn, cred["name"], r.owner_id) if cred else {}
                except AmuxError as e:  # e.g. the value was deleted or the key changed since admission
                    await finish_task(conn, r.task_id, Status.FAILED, now, error=e.message)
                    continue
                if self.auth is not None:
                    env.update(await self.coordination_env(conn, r.owner_id, r.session_id, r.task_id))
                if r.session_id and self.auth is not None:
                    await self._bind_memory(conn, r, caps, now)
                out.append(p.Dispatch(task_id=r.task_id, attempt=r.attempt, prompt=r.prompt, snapshot=r.snapshot,
                                      env=env).model_dump())
            steers = (await conn.execute(
                sa.select(mailbox.c.id, mailbox.c.task_id, mailbox.c.text).join(task_runs, task_runs.c.id == mailbox.c.task_id)
                .where(mailbox.c.kind == "steer", mailbox.c.state == "pending", mailbox.c.sent_at.is_(None),
                       task_runs.c.runtime_id == runtime_id))).all()
            for st in steers:
                await conn.execute(mailbox.update().where(mailbox.c.id == st.id).values(sent_at=now))
                out.append(p.Steer(task_id=st.task_id, steer_id=st.id, text=st.text).model_dump())
        for a in answers:
            out.append(p.PermissionAnswer(task_id=a.task_id, request_id=a.request_id, allow=a.allow,
                                          message=a.message or "").model_dump())
        for c in cancels:
            if c.id not in cancels_sent:
                cancels_sent.add(c.id)
                out.append(p.Cancel(task_id=c.id).model_dump())
        return out
