"""Placement (queued → reserved on a runtime) and the reaper (TTL, lost runtimes, deadlines)."""
from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any, Callable

import sqlalchemy as sa

from ..clock import Clock, utc
from ..config import HubSettings
from ..domain.tasks import RUNTIME_LOST, Status
from ..ids import new_id
from ..store.db import Database
from ..store.tables import api_tokens, reservations, runtimes, task_runs
from .notify import Notifier
from .tasks import finish_task, task_key

log = logging.getLogger("amux.dispatch")
ACTIVE_RES = ("pending", "committed")


def eligible(task: Any, runtime: Any) -> bool:
    """Return whether `runtime` may run `task`: engine, requested runtime, owner, workspace access."""
    snap = task.snapshot
    caps = runtime.capabilities
    if snap["engine"] not in caps.get("engines", []):
        return False
    if snap.get("runtime") and snap["runtime"] != runtime.name:
        return False
    if snap.get("platform") and snap["platform"] != caps.get("platform"):
        return False
    if not caps.get("workspace_writable", False):
        return False
    return bool(runtime.shared) or runtime.principal_id == task.owner_id


def waiting_for(task: Any, known: list[Any]) -> str:
    """Say why a queued task waits, from the runtimes the hub knows (any status)."""
    snap = task.snapshot
    named = snap.get("runtime")
    if named:
        rt = next((r for r in known if r.name == named), None)
        if rt is None:
            return f"waiting for runtime {named}, which is not registered"
        if rt.status != "online":
            since = utc(rt.last_seen_at).isoformat() if rt.last_seen_at else "its registration"
            return f"waiting for runtime {named}, {rt.status} since {since}"
        if not eligible(task, rt):
            return f"runtime {named} is online but cannot take it (engine, platform, workspace or owner)"
        return f"waiting for a free slot on runtime {named}"
    able = [r for r in known if eligible(task, r)]
    online = [r for r in able if r.status == "online"]
    if online:
        return f"waiting for a free slot ({len(online)} eligible runtime(s) online, all busy)"
    what = f"engine {snap.get('engine')}" + (f" on {snap['platform']}" if snap.get("platform") else "")
    if able:
        return f"waiting for a runtime that offers {what}; {', '.join(r.name for r in able)} offline"
    return f"waiting for a runtime that offers {what}; none is registered for this task's owner"


class Dispatcher:
    """Reserve capacity for queued tasks and reap what time has run out on."""

    def __init__(self, db: Database, clock: Clock, notifier: Notifier, settings: HubSettings,
                 on_dispatch_latency: Callable[[float], None] | None = None) -> None:
        self.db = db
        self.clock = clock
        self.notifier = notifier
        self.settings = settings
        self.kicked = asyncio.Event()
        self.on_dispatch_latency = on_dispatch_latency or (lambda s: None)

    def kick(self) -> None:
        """Ask the placement loop to run now."""
        self.kicked.set()

    async def place_once(self, batch: int = 200) -> int:
        """Reserve capacity for as many queued tasks as fit; return how many were placed."""
        now = self.clock.now()
        placed: list[tuple[str, str]] = []
        async with self.db.write() as conn:
            # One placement at a time across replicas; an advisory lock, since row locks on every runtime
            # deadlocked with runners' heartbeats and reports under load (the soak, docs/deploy.md).
            await self.db.serialize(conn, "placement")
            online = (await conn.execute(
                sa.select(runtimes).where(runtimes.c.status == "online").order_by(runtimes.c.id))).all()
            if not online:
                return 0
            used = dict((await conn.execute(
                sa.select(reservations.c.runtime_id, sa.func.count())
                .where(reservations.c.state.in_(ACTIVE_RES)).group_by(reservations.c.runtime_id))).all())
            free = {r.id: r.slots - used.get(r.id, 0) for r in online}
            capacity = sum(max(0, n) for n in free.values())
            if capacity == 0:
                return 0  # nothing fits: don't read the queue at all
            running = await self._running_by_owner(conn)
            queued = await self._fair_queue(conn, min(batch, capacity * 4), running)
            limited = self.settings.max_running_per_principal
            exempt = await self._exempt_owners(conn, {t.owner_id for t in queued}) if limited else set()
            # One run at a time per session: a session's turns (and an instance's runs) go in order.
            busy = {r.session_id for r in await conn.execute(sa.select(task_runs.c.session_id).where(
                task_runs.c.status.in_([Status.DISPATCHED.value, Status.RUNNING.value]),
                task_runs.c.session_id.is_not(None)))} if any(t.session_id for t in queued) else set()
            res_rows, task_rows = [], []
            expires = now + timedelta(seconds=self.settings.reservation_ttl_s)
            for task in queued:
                if task.session_id and task.session_id in busy:
                    continue
                if limited and running.get(task.owner_id, 0) >= limited and task.owner_id not in exempt:
                    continue  # at hub.max_running_per_principal: the others go first
                candidates = [r for r in online if free[r.id] > 0 and eligible(task, r)]
                if not candidates:
                    continue
                if task.session_id:
                    busy.add(task.session_id)
                rt = max(candidates, key=lambda r: free[r.id])  # spread load
                free[rt.id] -= 1
                running[task.owner_id] = running.get(task.owner_id, 0) + 1
                attempt = task.attempt + 1
                timeout = float(task.snapshot.get("timeout_s") or self.settings.default_timeout_s)
                res_rows.append({"id": new_id("res"), "runtime_id": rt.id, "task_id": task.id, "attempt": attempt,
                                 "state": "pending", "created_at": now, "expires_at": expires})
                task_rows.append({"tid": task.id, "rt": rt.id, "attempt": attempt,
                                  "deadline": now + timedelta(seconds=timeout)})
                placed.append((task.id, rt.id))
            if placed:
                await conn.execute(reservations.insert(), res_rows)
                await conn.execute(
                    task_runs.update().where(task_runs.c.id == sa.bindparam("tid")).values(
                        status=Status.DISPATCHED.value, runtime_id=sa.bindparam("rt"), attempt=sa.bindparam("attempt"),
                        last_rseq=0, dispatched_at=now, deadline_at=sa.bindparam("deadline")),
                    task_rows)
        for task_id, rt_id in placed:
            self.notifier.notify(f"runtime:{rt_id}")
            self.notifier.notify(task_key(task_id))
        return len(placed)

    async def _fair_queue(self, conn, limit: int, running: dict[str, int]) -> list[Any]:  # noqa: ANN001
        """Lock up to `limit` queued tasks, fairly across principals (weighted round robin).

        Each principal's oldest queued tasks are ranked by their place in that principal's own queue plus
        the runs it already has: one user's backlog of thousands waits behind another user's first task,
        and a principal with many runs yields to one with few. Ties go to the older task.
        """
        per_owner = sa.func.row_number().over(partition_by=task_runs.c.owner_id, order_by=task_runs.c.created_at)
        ranked = (sa.select(task_runs.c.id, task_runs.c.owner_id, task_runs.c.created_at, per_owner.label("place"))
                  .where(task_runs.c.status == Status.QUEUED.value).subquery())
        heads = (await conn.execute(sa.select(ranked).where(ranked.c.place <= limit))).all()
        if not heads:
            return []
        heads.sort(key=lambda r: (r.place + running.get(r.owner_id, 0), r.created_at, r.id))
        order = {r.id: i for i, r in enumerate(heads[:limit])}
        rows = (await conn.execute(self.db.for_update(
            sa.select(task_runs.c.id, task_runs.c.owner_id, task_runs.c.snapshot, task_runs.c.attempt,
                      task_runs.c.session_id, task_runs.c.created_at)
            .where(task_runs.c.id.in_(list(order)), task_runs.c.status == Status.QUEUED.value),
            skip_locked=True))).all()
        return sorted(rows, key=lambda r: order[r.id])

    async def _running_by_owner(self, conn) -> dict[str, int]:  # noqa: ANN001
        return dict((await conn.execute(
            sa.select(task_runs.c.owner_id, sa.func.count())
            .where(task_runs.c.status.in_([Status.DISPATCHED.value, Status.RUNNING.value]))
            .group_by(task_runs.c.owner_id))).all())

    async def _exempt_owners(self, conn, owners: set[str]) -> set[str]:  # noqa: ANN001
        """Principals holding a live admin token: the per-principal limits do not apply to them."""
        if not owners:
            return set()
        return set((await conn.execute(sa.select(api_tokens.c.principal_id).distinct().where(
            api_tokens.c.principal_id.in_(owners), api_tokens.c.admin.is_(True),
            api_tokens.c.revoked_at.is_(None)))).scalars())

    async def reap_once(self) -> dict[str, int]:
        """Expire uncommitted reservations, fail tasks of lost runtimes, time out overdue runs."""
        now = self.clock.now()
        counts = {"expired": 0, "lost": 0, "timed_out": 0}
        touched: list[str] = []
        async with self.db.write() as conn:
            await self.db.serialize(conn, "placement")  # the reaper moves what placement reads
            expired = (await conn.execute(
                sa.select(reservations.c.id, reservations.c.task_id)
                .where(reservations.c.state == "pending", reservations.c.expires_at < now))).all()
            for res in expired:
                # The task row first, then its reservation: the order a runner's report takes them in
                # (accepting a dispatch marks the task running, then commits the reservation), so no deadlock.
                moved = await conn.execute(task_runs.update().where(
                    task_runs.c.id == res.task_id, task_runs.c.status == Status.DISPATCHED.value)
                    .values(status=Status.QUEUED.value, runtime_id=None))
                await conn.execute(reservations.update().where(reservations.c.id == res.id, reservations.c.state == "pending")
                                   .values(state="released", released_at=now))
                counts["expired"] += moved.rowcount
                touched.append(res.task_id)
            lost_before = now - timedelta(seconds=self.settings.runtime_lost_s)
            lost = (await conn.execute(sa.select(runtimes.c.id).where(
                runtimes.c.status.in_(["online", "offline"]), runtimes.c.last_seen_at < lost_before))).all()
            for rt in lost:
                await conn.execute(runtimes.update().where(runtimes.c.id == rt.id).values(status="lost", connection_id=None))
                victims = (await conn.execute(sa.select(task_runs.c.id).where(
                    task_runs.c.runtime_id == rt.id,
                    task_runs.c.status.in_([Status.DISPATCHED.value, Status.RUNNING.value])))).all()
                for v in victims:
                    if await finish_task(conn, v.id, Status.FAILED, now, error=RUNTIME_LOST):
                        counts["lost"] += 1
                        touched.append(v.id)
            grace = timedelta(seconds=self.settings.deadline_grace_s)
            overdue = (await conn.execute(sa.select(task_runs.c.id).where(
                task_runs.c.status.in_([Status.DISPATCHED.value, Status.RUNNING.value]),
                task_runs.c.deadline_at < now - grace))).all()
            for t in overdue:
                if await finish_task(
                        conn, t.id, Status.TIMED_OUT, now, error="deadline passed without a report from the runner"):
                    counts["timed_out"] += 1
                    touched.append(t.id)
            counts["not_placed"] = await self._fail_unplaceable(conn, now, touched)
        for task_id in touched:
            self.notifier.notify(task_key(task_id))
        if touched:
            self.kick()
        return counts

    async def _fail_unplaceable(self, conn, now: Any, touched: list[str]) -> int:  # noqa: ANN001
        """Fail tasks queued past `hub.queue_timeout_s` that no online runtime could ever take, saying why."""
        before = now - timedelta(seconds=self.settings.queue_timeout_s)
        stale = (await conn.execute(sa.select(task_runs.c.id, task_runs.c.owner_id, task_runs.c.snapshot).where(
            task_runs.c.status == Status.QUEUED.value, task_runs.c.created_at < before).limit(500))).all()
        if not stale:
            return 0
        known = (await conn.execute(sa.select(runtimes))).all()
        failed = 0
        for task in stale:
            if any(r.status == "online" and eligible(task, r) for r in known):
                continue  # it can run: it only waits for a slot
            if await finish_task(conn, task.id, Status.FAILED, now, error=f"not placed: {waiting_for(task, known)}"):
                failed += 1
                touched.append(task.id)
        return failed

    async def placement_step(self) -> float:
        """Place one batch; run again at once while there was work, else wait for a kick or a few poll intervals
        (work other replicas admitted). Run under the loop supervisor, woken by `kicked`."""
        return 0.0 if await self.place_once() > 0 else self.settings.poll_s * 2

    async def reaper_step(self) -> None:
        """Reap once (the rules compare against the injected clock); the supervisor runs it every second."""
        await self.reap_once()
