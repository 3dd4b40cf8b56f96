"""Runtime registration: a runner registers its runtime (a name it owns, bound to its token), the hub
reconciles the work it holds; deregistration frees the name."""
from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta


from ...clock import Clock
from ...config import ExecutionSettings
from ...domain import isolation
from ...domain.tasks import RUNTIME_LOST, Status, is_terminal
from ...errors import Conflict, Invalid, NotFound
from ...ids import new_id
from ...runner import protocol as p
from ...store.db import Connection, Database, Row
from ...store.registry import RegistrationRace, SqlRegistryStore
from ...store.reports import SqlReportStore
from ...store.tasks import SqlTaskStore
from ..auth.service import Caller
from .dispatch import Dispatcher

log = logging.getLogger("amux.registry")


TAKEN = ("runtime name {name!r} belongs to {owner!r}, who registered it first; start the runner with another "
         "--name, or have {owner!r} deregister it (`DELETE /api/v1/runtimes/{name}` with their token) while its "
         "runner is stopped")
BOUND = ("runtime name {name!r} is bound to the runner token that registered it, and this is another token; start "
         "this runner with another --name, or free the name first: `amux runtime deregister {name}` (the owner, or "
         "an admin: `DELETE /api/v1/runtimes/{name}`) while its runner is stopped")


class RuntimeRegistry:
    """Register, list and deregister runtimes; every method is idempotent under resends."""

    def __init__(self, db: Database, clock: Clock, dispatcher: Dispatcher,
                 execution: ExecutionSettings | None = None, reap_s: float = 0.0) -> None:
        self.db = db
        self.reap_s = reap_s  # hub.runtime_reap_s (0: runtimes are never removed)
        self.execution = execution or ExecutionSettings()
        self.store = SqlRegistryStore(db)
        self.reports_store = SqlReportStore(db)
        self.tasks = SqlTaskStore(db)
        self.clock = clock
        self.dispatcher = dispatcher

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
        for t in await self.reports_store.runs_on(conn, rt_id):
            if held.get(t.id) == t.attempt:
                continue
            if t.status == Status.RUNNING.value:
                await self.tasks.finish(conn, t.id, Status.FAILED, now,
                                        error="runtime lost: the runner restarted without this task; resubmit it")
            else:  # dispatched but never started: send it again on this connection
                await self.reports_store.resend_dispatch(conn, t.id)
        for task_id, attempt in held.items():
            placed = await self.reports_store.placement_of(conn, task_id)
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

    async def reap_step(self) -> float | None:
        """Remove the runtimes offline longer than `hub.runtime_reap_s` that hold no work, freeing their names (a
        replaced runner pod or container leaves its old row behind); one pass of the `runtime-reaper` loop."""
        if self.reap_s <= 0:
            return None
        cutoff = self.clock.now() - timedelta(seconds=self.reap_s)
        names = await self.db.transaction(lambda conn: self.store.reap(conn, cutoff))
        for name in names:
            log.info("runtime %s removed: offline since before %s with no work left (hub.runtime_reap_s)",
                     name, cutoff.isoformat(timespec="seconds"))
        return None

    async def list_runtimes(self) -> list[dict]:
        """Return every registered runtime by name: id, name, status, slots, capabilities."""
        async with self.db.read() as conn:
            rows = await self.store.list_all(conn)
        return [{"id": x.id, "name": x.name, "status": x.status, "slots": x.slots, "capabilities": x.capabilities}
                for x in rows]

    async def disconnected(self, runtime_id: str, conn_id: str) -> None:
        """Mark the runtime offline; its tasks wait for a reconnect until the lost timeout."""
        await self.db.transaction(lambda conn: self.store.mark_offline(conn, runtime_id, conn_id))
