"""Placement (queued → reserved on a runtime), the reaper (TTL, lost runtimes, deadlines), and what each runner
connection is sent (`RunnerDispatch`)."""
from __future__ import annotations

import asyncio
import logging
from functools import partial
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any, Callable, Collection, Protocol

from ...clock import Clock
from ...config import ExecutionSettings, HubSettings
from ...domain import isolation
from ...domain import memory as memory_rules
from ...domain.fair_share import FairShares
from ...domain.placement import unfit, waiting_for
from ...domain.tasks import RUNTIME_LOST, Status
from ...errors import AmuxError
from ...runner import protocol as p
from ...store.db import Connection, Database, Row
from ...store.dispatch import Placement, SqlDispatchStore
from ...store.execution_uids import SqlExecutionUidStore
from ...store.registry import SqlRegistryStore
from ...store.reports import SqlReportStore
from ...store.tasks import SqlTaskStore
from ..auth.service import AuthService, RunToken
from ..auth.credentials import CredentialService
from ..notify import Notifier, task_key

log = logging.getLogger("amux.dispatch")


class HandOff(Protocol):
    """Placement's hand-off to this replica's runner connections (the runner endpoint's): the dispatches of the
    runtimes it serves are built in placement's own transaction and sent once it commits, with no pump round."""

    async def serving(self, conn: Connection, runtimes: dict[str, Row]) -> set[str]:
        """Of these runtimes (their rows as placement read them), those a live connection of this replica serves."""

    async def dispatch(self, conn: Connection, now: datetime, runs: list[SimpleNamespace]) -> Callable[[], None]:
        """Build the dispatches of these runs, placed on runtimes it serves and reserved as sent; return what queues
        them on their sockets once the transaction has committed."""


def eligible(task: Any, runtime: Any) -> bool:
    """Return whether `runtime` may run `task`: requested runtime, engine, platform, workspace access, owner."""
    return unfit(task.snapshot, task.owner_id, runtime) is None


class _Round:
    """What one placement round has decided so far: free slots, runs held, shares, sessions, placements."""

    def __init__(self, now: datetime, free: dict[str, int], held: dict[tuple[str, str], int]) -> None:
        self.now, self.free, self.held = now, free, held
        self.running: dict[str, int] = {}  # runs per owner, this round's placements included
        for (owner, _), n in held.items():
            self.running[owner] = self.running.get(owner, 0) + n
        self.shares: FairShares | None = None
        self.busy: set[str] = set()  # sessions with a run on a runtime (one run at a time per session)
        self.gave_way: set[str] = set()  # sessions whose next run gave way: their later runs wait behind it
        self.owners: set[str] = set()  # the owners of the window's tasks
        self.exempt: set[str] | None = None  # of those, the ones holding an admin token, read when one is at the cap
        self.uids: dict[str, int] = {}  # the linux-dac uid of each owner that has one
        self.placed: list[Placement] = []

    def place(self, task: Row, runtime_id: str, timeout_s: float) -> None:
        """Place the task on the runtime: one slot fewer there, one run more for its owner."""
        self.free[runtime_id] -= 1
        self.running[task.owner_id] = self.running.get(task.owner_id, 0) + 1
        if task.session_id:
            self.busy.add(task.session_id)
        if self.shares is not None:
            self.shares.placed(task.id, runtime_id)
        self.placed.append(Placement(task_id=task.id, runtime_id=runtime_id, attempt=task.attempt + 1,
                                     deadline_at=self.now + timedelta(seconds=timeout_s)))

    def not_starting(self, task: Row) -> None:
        """Note that the task will not start this round (it no longer waits for a slot of it)."""
        if self.shares is not None:
            self.shares.not_starting(task.id)


class Dispatcher:
    """Reserve capacity for queued tasks and reap what time has run out on."""

    def __init__(self, db: Database, clock: Clock, notifier: Notifier, settings: HubSettings,
                 on_dispatch_latency: Callable[[float], None] | None = None,
                 execution: ExecutionSettings | None = None) -> None:
        self.db = db
        self.execution = execution or ExecutionSettings()
        self.uids = SqlExecutionUidStore()
        self.store = SqlDispatchStore(db)
        self.registry_store = SqlRegistryStore(db)
        self.tasks = SqlTaskStore(db)
        self.clock = clock
        self.notifier = notifier
        self.settings = settings
        self.kicked = asyncio.Event()
        self.on_dispatch_latency = on_dispatch_latency or (lambda s: None)
        self.hand_off: HandOff | None = None  # the runner endpoint's, when this replica serves runner connections

    def kick(self) -> None:
        """Ask the placement loop to run now."""
        self.kicked.set()

    async def place_once(self, batch: int = 200) -> int:
        """Reserve capacity for as many queued tasks as fit; return how many were placed."""
        if not await self.store.any_queued():
            # Most kicks come from runs that ended, with nothing waiting: a read, not a write transaction (which
            # holds SQLite's one writer). A submission committed after this read kicks placement again.
            return 0
        now = self.clock.now()
        placed, send, served = await self.db.transaction(lambda conn: self._place_and_hand_off(conn, now, batch))
        send()
        for rt in {pl.runtime_id for pl in placed} - served:
            self.notifier.notify(f"runtime:{rt}")
        for pl in placed:
            self.notifier.notify(task_key(pl.task_id))
        return len(placed)

    async def _place_and_hand_off(self, conn: Connection, now: datetime,
                                  batch: int) -> tuple[list[Placement], Callable[[], None], set[str]]:
        """Place a batch and reserve it; the dispatches for runtimes this replica's runner connections serve are
        reserved as sent, built in the same transaction and sent once it commits (no pump round between a
        submission and its runner). Return the placements, what sends, and the runtimes served here."""
        placed, online, rows = await self._place(conn, now, batch)
        served: set[str] = set()
        if placed and self.hand_off is not None:
            used = {pl.runtime_id for pl in placed}
            served = await self.hand_off.serving(conn, {r.id: r for r in online if r.id in used})
        await self.store.reserve(conn, placed, now, now + timedelta(seconds=self.settings.reservation_ttl_s),
                                 sent_on=served)
        if not served or self.hand_off is None:
            return placed, lambda: None, served
        caps = {r.id: r.capabilities for r in online}
        runs = [SimpleNamespace(task_id=pl.task_id, attempt=pl.attempt, runtime_id=pl.runtime_id,
                                capabilities=caps[pl.runtime_id], prompt=rows[pl.task_id].prompt,
                                snapshot=rows[pl.task_id].snapshot, owner_id=rows[pl.task_id].owner_id,
                                session_id=rows[pl.task_id].session_id, kind=rows[pl.task_id].kind)
                for pl in placed if pl.runtime_id in served]
        return placed, await self.hand_off.dispatch(conn, now, runs), served

    async def _place(self, conn: Connection, now: datetime,
                     batch: int) -> tuple[list[Placement], list[Row], dict[str, Row]]:
        """One placement round in the caller's transaction: choose a runtime for each queued task that fits (the
        caller reserves them); return the placements, the online runtimes it read and the queued rows it locked."""
        # One placement at a time across replicas; an advisory lock, since row locks on every runtime
        # deadlocked with runners' heartbeats and reports under load (the soak, docs/deploy.md).
        await self.db.serialize(conn, "placement")
        online = await self.store.online(conn)
        free = {r.id: r.slots - r.used for r in online}
        capacity = sum(max(0, n) for n in free.values())
        if capacity == 0:
            return [], online, {}  # nothing fits (or nothing is online): don't read the queue at all
        round_ = _Round(now, free, await self.store.active_runs_by_owner_and_runtime(conn))
        queued, fits = await self._window(conn, online, round_, min(batch, capacity * 4), batch)
        round_.owners = {t.owner_id for t in queued}
        # A linux-dac run needs its owner's uid; an owner the range has no uid left for waits (`waiting_for`).
        dac = {t.owner_id for t in queued if isolation.runs_as_principal(t.snapshot)}
        round_.uids = (await self.uids.allocate(conn, dac, self.execution.uid_base, self.execution.uid_count, now)
                       if dac else {})
        # The fair share matters only between principals: alone, a principal uses every free slot.
        if len(set(round_.running) | round_.owners) > 1:
            round_.shares = FairShares({r.id: r.slots for r in online}, round_.held,
                                       {t.id: (t.owner_id, frozenset(r.id for r in fits[t.id])) for t in queued})
        deferred = [t for t in queued if not await self._place_one(conn, round_, t, fits[t.id])]
        for task in deferred:  # it gave way to principals below their fair share: what they left is its to take
            await self._place_one(conn, round_, task, fits[task.id], last=True)
        return round_.placed, online, {t.id: t for t in queued}

    async def _window(self, conn: Connection, online: list[Row], round_: _Round, limit: int,
                      batch: int) -> tuple[list[Row], dict[str, list[Row]]]:
        """Lock the round's window of queued tasks, in placement order, with the online runtimes each could run on
        (and read the busy sessions, when the window holds a session's run).

        A principal none of whose tasks in the window can start — each waits for runtimes with no free slot
        (pinned to its own busy runtime, say) or behind its session's running turn — while it has more queued gets
        those read too (up to `batch`): a task of its that could start must not wait behind them, leaving a slot
        idle or its fair share to others.
        """
        queued, order, deeper = await self._fair_queue(conn, limit, round_.running)
        fits = {t.id: [r for r in online if eligible(t, r)] for t in queued}
        if any(t.session_id for t in queued):
            round_.busy = await self.store.busy_sessions(conn)
        stuck = {t.owner_id for t in queued} - {
            t.owner_id for t in queued
            if t.session_id not in round_.busy and any(round_.free[r.id] > 0 for r in fits[t.id])}
        if stuck & deeper and batch > limit:
            more, more_order, _ = await self._fair_queue(conn, batch, round_.running, owners=stuck & deeper,
                                                         seen=set(order))
            fits.update((t.id, [r for r in online if eligible(t, r)]) for t in more)
            if any(t.session_id for t in more) and not round_.busy:
                round_.busy = await self.store.busy_sessions(conn)
            order.update(more_order)
            queued = sorted(queued + more, key=lambda r: order[r.id])
        return queued, fits

    async def _place_one(self, conn: Connection, round_: _Round, task: Row, fits: list[Row],
                         last: bool = False) -> bool:
        """Place one task when it may start and a runtime fits; return False only when it gave way to principals
        below their fair share (`last`: the round's second pass, where it no longer waits for them)."""
        # One run at a time per session: a session's turns (and an instance's runs) go in order.
        if task.session_id and task.session_id in round_.busy:
            round_.not_starting(task)
            return True
        if task.owner_id not in round_.uids and isolation.runs_as_principal(task.snapshot):
            round_.not_starting(task)
            return True  # no uid left in execution.uid_base/uid_count: it waits
        limited = self.settings.max_running_per_principal
        if limited and round_.running.get(task.owner_id, 0) >= limited:
            if round_.exempt is None:  # admins are not limited: read only when someone is at the cap
                round_.exempt = await self.store.admin_holders(conn, round_.owners)
            if task.owner_id not in round_.exempt:
                round_.not_starting(task)
                return True  # at hub.max_running_per_principal: the others go first
        if not last and task.session_id in round_.gave_way:
            return False  # its session's earlier run gave way: it stays behind that run
        candidates = [r for r in fits if round_.free[r.id] > 0]
        if candidates and round_.shares is not None:
            fair = [r for r in candidates if round_.shares.may_take(task.id, r.id)]
            if not fair and not last:
                if task.session_id:
                    round_.gave_way.add(task.session_id)
                return False
            candidates = fair
        if not candidates:
            return True
        rt = max(candidates, key=lambda r: round_.free[r.id])  # spread load
        timeout = float(task.snapshot.get("timeout_s") or self.settings.default_timeout_s)
        round_.place(task, rt.id, timeout)
        return True

    async def _fair_queue(self, conn: Connection, limit: int, running: dict[str, int], *,
                          owners: set[str] | None = None,
                          seen: Collection[str] = ()) -> tuple[list[Row], dict[str, tuple], set[str]]:
        """Lock up to `limit` queued tasks (of `owners` only, when given; none of `seen`), fairly across principals
        (weighted round robin); return them in order, each one's place in that order, and the principals that
        have more queued than it read.

        Each principal's oldest queued tasks are ranked by their place in that principal's own queue plus
        the runs it already has: one user's backlog of thousands waits behind another user's first task,
        and a principal with many runs yields to one with few. Ties go to the older task.
        """
        heads = await (self.store.queue_heads(conn, limit) if owners is None
                       else self.store.queue_heads_of(conn, owners, limit))
        deeper = {r.owner_id for r in heads if r.place >= limit}
        ranked = sorted(((r.place + running.get(r.owner_id, 0), r.created_at, r.id), r.id) for r in heads
                        if r.id not in seen)[:limit]
        if not ranked:
            return [], {}, deeper
        order = {task_id: key for key, task_id in ranked}
        rows = await self.store.lock_queued(conn, list(order))
        return sorted(rows, key=lambda r: order[r.id]), order, deeper

    async def reap_once(self) -> dict[str, int]:
        """Expire uncommitted reservations, fail tasks of lost runtimes, time out overdue runs."""
        now = self.clock.now()
        s = self.settings
        if not await self.store.anything_to_reap(now, now - timedelta(seconds=s.runtime_lost_s),
                                                 now - timedelta(seconds=s.deadline_grace_s),
                                                 now - timedelta(seconds=s.queue_timeout_s)):
            # A read, no write transaction.
            return {"expired": 0, "lost": 0, "requeued": 0, "timed_out": 0, "not_placed": 0}
        counts, touched = await self.db.transaction(lambda conn: self._reap(conn, now))
        for task_id in touched:
            self.notifier.notify(task_key(task_id))
        if touched:
            self.kick()
        return counts

    async def _reap(self, conn: Connection, now: datetime) -> tuple[dict[str, int], list[str]]:
        """One reaper round in the caller's transaction; return the counts and the tasks it changed."""
        counts = {"expired": 0, "lost": 0, "requeued": 0, "timed_out": 0}
        touched: list[str] = []
        await self.db.serialize(conn, "placement")  # the reaper moves what placement reads
        # Each expired reservation: its task row first, then the reservation (see release_expired).
        for res in await self.store.release_expired(conn, now):
            counts["expired"] += int(res.requeued)
            touched.append(res.task_id)
        lost_before = now - timedelta(seconds=self.settings.runtime_lost_s)
        for rt_id in await self.store.silent_since(conn, lost_before):
            if not await self.store.mark_lost(conn, rt_id, lost_before):
                continue  # it spoke meanwhile
            # Dispatched but never accepted: its engine never launched (the runner launches only after the hub
            # commits its acceptance), so it is placed again. Running: accepted, so its fate is unknown.
            for task_id, status in await self.store.active_runs(conn, rt_id):
                if status == Status.DISPATCHED.value:
                    if await self.store.requeue_unstarted(conn, task_id, now):
                        counts["requeued"] += 1
                        touched.append(task_id)
                elif await self.tasks.finish(conn, task_id, Status.FAILED, now, error=RUNTIME_LOST):
                    counts["lost"] += 1
                    touched.append(task_id)
        grace = timedelta(seconds=self.settings.deadline_grace_s)
        for task_id in await self.store.overdue(conn, now - grace):
            if await self.tasks.finish(
                    conn, task_id, Status.TIMED_OUT, now, error="deadline passed without a report from the runner"):
                counts["timed_out"] += 1
                touched.append(task_id)
        counts["not_placed"] = await self._fail_unplaceable(conn, now, touched)
        return counts, touched

    async def _fail_unplaceable(self, conn: Connection, now: datetime, touched: list[str]) -> int:
        """Fail tasks queued past `hub.queue_timeout_s` that no online runtime could ever take, saying why."""
        stale = await self.store.queued_since(conn, now - timedelta(seconds=self.settings.queue_timeout_s))
        if not stale:
            return 0
        known = await self.registry_store.list_all(conn)
        failed = 0
        for task in stale:
            if any(r.status == "online" and eligible(task, r) for r in known):
                continue  # it can run: it only waits for a slot
            why = f"not placed: {waiting_for(task.snapshot, task.owner_id, known)}"
            if await self.tasks.finish(conn, task.id, Status.FAILED, now, error=why):
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


Current = dict[str, tuple[str | None, dict[str, Any]]]
"""Each runtime's current connection id and capabilities, by runtime id."""


def run_label(session_id: str | None, task_id: str | None) -> str:
    """The label of a run token: `amux-session:<id>` for a session's runs (delegations and memory key on it),
    `run:<task id>` otherwise."""
    return f"amux-session:{session_id}" if session_id else f"run:{task_id}"


@dataclass
class _Due:
    """What one connection is due this round: messages in sending order, and the runs to cancel."""

    messages: list[dict] = field(default_factory=list)
    cancels: list[tuple[str, int]] = field(default_factory=list)  # (task id, attempt)


@dataclass(kw_only=True)
class Link:
    """One runner connection a replica serves: its runtime, connection id, token, and the cancels sent on it."""

    runtime_id: str
    conn_id: str
    token_id: str | None = None
    cancels_sent: set[tuple[str, int]] = field(default_factory=set)  # (task id, attempt): a later attempt's is sent too


@dataclass(frozen=True, kw_only=True)
class Outbound:
    """What one pump round hands the connections: messages per connection id, and the connections to close —
    revoked (their token), or stale (no longer their runtime's current connection: the runtime was marked lost,
    or its runner registered again elsewhere)."""

    messages: dict[str, list[dict]]
    revoked: set[str]
    stale: set[str] = field(default_factory=set)


class RunnerDispatch:
    """What each runner connection is sent: dispatches (with their credentials, run token and memory binding),
    steers, permission answers and cancels."""

    def __init__(self, db: Database, clock: Clock, credentials: CredentialService,
                 auth: AuthService | None = None, hub_url: str = "") -> None:
        self.db = db
        self.uids = SqlExecutionUidStore()
        self.registry_store = SqlRegistryStore(db)
        self.reports_store = SqlReportStore(db)
        self.store = SqlDispatchStore(db)
        self.tasks = SqlTaskStore(db)
        self.clock = clock
        self.credentials = credentials
        self.auth = auth
        self.hub_url = hub_url

    def _coordination(self, token: str, session_id: str | None, direct: bool) -> dict[str, str]:
        """The environment a task child holding `token` is given: the hub's address, the token (and its session)."""
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
        stored = await self.reports_store.memory_scope(conn, r.session_id)
        scope, warn = memory_rules.bind(stored, bool(caps.get("memory_cli")))
        if scope != stored:
            await self.reports_store.bind_memory_scope(conn, r.session_id, scope)
        if warn:
            await self.tasks.append_event(conn, r.task_id, "warning", {
                "text": "memory capability discovery failed on this runtime (no `amux memory` CLI); "
                        "this conversation runs without amux memory"}, now)

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
        (`_coordination`) and its memory binding; a run whose credentials no longer resolve fails instead.
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
                                          uid=uids.get(r.owner_id) if r.owner_id in dac else None,
                                          principal=r.owner_id).model_dump())
                for r, env in ready]

    @staticmethod
    def outbound(links: list[Link], out: dict[str, _Due], revoked: set[str]) -> Outbound:
        """What a committed claim hands the connections (cancels added once per connection)."""
        by_conn = {link.conn_id: link for link in links}
        for conn_id, due in out.items():
            sent = by_conn[conn_id].cancels_sent
            for task_id, attempt in due.cancels:
                if (task_id, attempt) not in sent:
                    sent.add((task_id, attempt))
                    due.messages.append(p.Cancel(task_id=task_id, attempt=attempt).model_dump())
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
                one, gone = await self.db.transaction(partial(self._outgoing, links=[link], now=now))
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
        live = await self.registry_store.live_tokens(conn, [x.token_id for x in links if x.token_id is not None])
        revoked = {x.conn_id for x in links if x.token_id is not None and x.token_id not in live}
        if current is None:
            current = await self.registry_store.connections(
                conn, [x.runtime_id for x in links if x.conn_id not in revoked])
        serving = {x.runtime_id: x.conn_id for x in links
                   if x.conn_id not in revoked and current.get(x.runtime_id, (None, {}))[0] == x.conn_id}
        return revoked, current, serving

    async def _quiet(self, links: list[Link]) -> tuple[dict[str, _Due], set[str]] | None:
        """Read, outside any transaction, what a round owes these connections when it has nothing to claim (no
        unsent dispatch, permission answer or steer): the revoked and the stale, and the cancels. None when there is
        something to claim, which takes a write transaction."""
        async with self.db.read() as conn:
            revoked, _, serving = await self._serving(conn, links)
            out = {c: _Due() for c in serving.values()}
            if not serving:
                return out, revoked
            if await self.store.claimable(conn, list(serving)):
                return None
            for c in await self.store.cancels_due(conn, list(serving)):
                out[serving[c.runtime_id]].cancels.append((c.task_id, c.attempt))
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
                p.Steer(task_id=st.task_id, steer_id=st.id, text=st.text, attempt=st.attempt).model_dump())
        for a in answers:
            out[serving[a.runtime_id]].messages.append(p.PermissionAnswer(
                task_id=a.task_id, request_id=a.request_id, allow=a.allow, message=a.message or "",
                attempt=a.attempt).model_dump())
        for c in cancels:
            out[serving[c.runtime_id]].cancels.append((c.task_id, c.attempt))
        return out, revoked
