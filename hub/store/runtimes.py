"""Runtimes and reservations: registration, placement, the reaper and the runner protocol's queries."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Collection

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from ..domain.tasks import Status
from ..ids import new_id
from .db import Connection, Database, HotRead, Row, among, one_of, run, run_many
from .tables import TS, api_tokens, mailbox, permission_replies, principals, reservations, runtimes, sessions, task_runs

ACTIVE_RES = ("pending", "committed")
ON_RUNTIME = [Status.DISPATCHED.value, Status.RUNNING.value]

# The runner reports' statements, built once: building a statement costs more than running it (bench/dispatch).
# What the reports read of the run they apply to (never its prompt or snapshot).
HELD_COLUMNS = [task_runs.c[n] for n in ("id", "owner_id", "session_id", "kind", "status", "created_at", "runtime_id",
                                          "attempt", "cancel_requested_at", "last_rseq", "event_seq", "usage_json",
                                          "error")]
_HELD = sa.select(*HELD_COLUMNS).where(task_runs.c.id == sa.bindparam("b_task_id"))
_HELD_MANY = (sa.select(*HELD_COLUMNS).where(one_of(task_runs.c.id, "b_task_ids"))
              .order_by(task_runs.c.id))  # one lock order for every batch (PostgreSQL)
_START_TASK = HotRead(task_runs.update().where(task_runs.c.id == sa.bindparam("b_task_id"))
                      .values(status=Status.RUNNING.value, started_at=sa.bindparam("b_now")))
_COMMIT_RESERVATION = HotRead(reservations.update().where(
    reservations.c.task_id == sa.bindparam("b_task_id"), reservations.c.attempt == sa.bindparam("b_attempt"),
    reservations.c.state == "pending").values(state="committed"))
# A placement round's writes: a pending reservation per placement, and each task marked dispatched (executemany).
_RESERVE = HotRead(reservations.insert().values(
    id=sa.bindparam("b_id"), runtime_id=sa.bindparam("b_runtime_id"), task_id=sa.bindparam("b_task_id"),
    attempt=sa.bindparam("b_attempt"), state="pending", created_at=sa.bindparam("b_now", type_=TS),
    expires_at=sa.bindparam("b_expires_at", type_=TS), sent_at=sa.bindparam("b_sent_at", type_=TS)))
_MARK_DISPATCHED = HotRead(task_runs.update().where(task_runs.c.id == sa.bindparam("b_task_id")).values(
    status=Status.DISPATCHED.value, runtime_id=sa.bindparam("b_runtime_id"), attempt=sa.bindparam("b_attempt"),
    last_rseq=0, dispatched_at=sa.bindparam("b_now", type_=TS), deadline_at=sa.bindparam("b_deadline_at", type_=TS)))
_OFFERS = sa.select(runtimes.c.name, runtimes.c.capabilities)  # admission reads it for every submission
# Each placement round's reads.
_RUNS_BY_OWNER = HotRead(sa.select(task_runs.c.owner_id, task_runs.c.runtime_id, sa.func.count().label("n"))
                         .where(among(task_runs.c.status, ON_RUNTIME))
                         .group_by(task_runs.c.owner_id, task_runs.c.runtime_id))
_RANKED = (sa.select(task_runs.c.id, task_runs.c.owner_id, task_runs.c.created_at,
                     sa.func.row_number().over(partition_by=task_runs.c.owner_id,
                                               order_by=task_runs.c.created_at).label("place"))
           .where(task_runs.c.status == Status.QUEUED.value))
_QUEUED_ALL = _RANKED.subquery()
_QUEUE_HEADS = HotRead(sa.select(_QUEUED_ALL).where(_QUEUED_ALL.c.place <= sa.bindparam("per_owner")))
_QUEUED_OF = _RANKED.where(one_of(task_runs.c.owner_id, "b_owners")).subquery()  # some owners' only
_QUEUE_HEADS_OF = HotRead(sa.select(_QUEUED_OF).where(_QUEUED_OF.c.place <= sa.bindparam("per_owner")))
_USED = (sa.select(reservations.c.runtime_id, sa.func.count().label("n"))
         .where(among(reservations.c.state, ACTIVE_RES)).group_by(reservations.c.runtime_id).subquery())
_ONLINE_USED = HotRead(sa.select(runtimes, sa.func.coalesce(_USED.c.n, 0).label("used"))
                       .select_from(runtimes.outerjoin(_USED, _USED.c.runtime_id == runtimes.c.id))
                       .where(runtimes.c.status == "online").order_by(runtimes.c.id))
_ANY_QUEUED = HotRead(sa.select(task_runs.c.id).where(task_runs.c.status == Status.QUEUED.value).limit(1))
# The idle rounds' one read each (a pump round with nothing to claim, a reaper round with nothing to reap).
_CLAIMABLE = sa.select(sa.or_(
    sa.select(reservations.c.id).join(task_runs, task_runs.c.id == reservations.c.task_id)
    .where(one_of(reservations.c.runtime_id, "b_ids"), reservations.c.state == "pending",
           reservations.c.sent_at.is_(None), task_runs.c.status == Status.DISPATCHED.value).exists(),
    sa.select(permission_replies.c.task_id).join(task_runs, task_runs.c.id == permission_replies.c.task_id)
    .where(one_of(task_runs.c.runtime_id, "b_ids"), task_runs.c.status == Status.RUNNING.value,
           permission_replies.c.sent_at.is_(None)).exists(),
    sa.select(mailbox.c.id).join(task_runs, task_runs.c.id == mailbox.c.task_id)
    .where(mailbox.c.kind == "steer", mailbox.c.state == "pending", mailbox.c.sent_at.is_(None),
           one_of(task_runs.c.runtime_id, "b_ids")).exists()))
_ANYTHING_TO_REAP = HotRead(sa.select(sa.or_(
    sa.select(reservations.c.id).where(reservations.c.state == "pending",
                                       reservations.c.expires_at < sa.bindparam("b_now")).exists(),
    sa.select(runtimes.c.id).where(among(runtimes.c.status, ["online", "offline"]),
                                   runtimes.c.last_seen_at < sa.bindparam("b_lost_before")).exists(),
    sa.select(task_runs.c.id).where(among(task_runs.c.status, ON_RUNTIME),
                                    task_runs.c.deadline_at < sa.bindparam("b_overdue_before")).exists(),
    sa.select(task_runs.c.id).where(task_runs.c.status == Status.QUEUED.value,
                                    task_runs.c.created_at < sa.bindparam("b_queued_before")).exists()).label("due")))
_HEARTBEAT = (runtimes.update().where(runtimes.c.id == sa.bindparam("b_runtime_id"),
                                      runtimes.c.connection_id == sa.bindparam("b_connection_id"))
              .values(last_seen_at=sa.bindparam("b_now"), status="online"))


_LOCK_QUEUED = (sa.select(task_runs.c.id, task_runs.c.owner_id, task_runs.c.snapshot, task_runs.c.attempt,
                          task_runs.c.session_id, task_runs.c.created_at, task_runs.c.prompt, task_runs.c.kind)
                .where(one_of(task_runs.c.id, "b_task_ids"), task_runs.c.status == Status.QUEUED.value))
_LIVE_TOKENS = HotRead(sa.select(api_tokens.c.id).where(one_of(api_tokens.c.id, "b_ids"),
                                                        api_tokens.c.revoked_at.is_(None)))


class RegistrationRace(Exception):
    """Another transaction registered the same runtime name first (PostgreSQL); register again to see its row."""


@dataclass(frozen=True, kw_only=True)
class Placement:
    """One queued task placed on a runtime by this round of placement."""

    task_id: str
    runtime_id: str
    attempt: int
    deadline_at: datetime


@dataclass(frozen=True)
class ExpiredReservation:
    """A pending reservation the reaper released, and whether its task went back to the queue."""

    task_id: str
    requeued: bool


class SqlRuntimeStore:
    """Runtimes (`runtimes`), capacity (`reservations`) and what placement, the reaper and runners read."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._held = HotRead(db.for_update(_HELD))
        self._held_many = HotRead(db.for_update(_HELD_MANY))
        self._lock_queued = HotRead(db.for_update(_LOCK_QUEUED, skip_locked=True))

    # --- runtimes -------------------------------------------------------------------------------------------

    async def list_all(self, conn: Connection) -> list[Row]:
        """Return every known runtime (any status), by name."""
        return list((await conn.execute(sa.select(runtimes).order_by(runtimes.c.name))).all())

    async def online(self, conn: Connection) -> list[Row]:
        """Return the online runtimes, by id, each with `used`: its active (pending or committed) reservations."""
        return (await run(conn, _ONLINE_USED)).rows

    async def find(self, conn: Connection, ref: str) -> Row | None:
        """Return the runtime whose id or name is `ref`, or None."""
        return (await conn.execute(sa.select(runtimes).where(
            sa.or_(runtimes.c.id == ref, runtimes.c.name == ref)))).first()

    async def by_name(self, conn: Connection, name: str, *, lock: bool = False) -> Row | None:
        """Return the runtime called `name` (locked until the transaction ends when `lock`), or None."""
        stmt = sa.select(runtimes).where(runtimes.c.name == name)
        return (await conn.execute(self.db.for_update(stmt) if lock else stmt)).first()

    async def name_of(self, conn: Connection, runtime_id: str) -> str | None:
        """Return the runtime's name, or None when it is unknown (deregistered)."""
        return (await conn.execute(sa.select(runtimes.c.name).where(runtimes.c.id == runtime_id))).scalar()

    async def names(self, conn: Connection, limit: int = 20) -> list[str]:
        """Return up to `limit` runtime names, sorted (to list in a refusal)."""
        return list((await conn.execute(
            sa.select(runtimes.c.name).order_by(runtimes.c.name).limit(limit))).scalars())

    async def engine_offered(self, conn: Connection, engine: str) -> bool:
        """Say whether any registered runtime (any status) lists `engine` in its capabilities."""
        caps = (await conn.execute(sa.select(runtimes.c.capabilities))).scalars()
        return any(engine in c.get("engines", []) for c in caps)

    async def platforms_offering(self, conn: Connection, engine: str) -> dict[str, str | None]:
        """Map each registered runtime (any status) that lists `engine` to the platform it reported (None: none)."""
        rows = (await conn.execute(_OFFERS)).all()
        return {r.name: (r.capabilities or {}).get("platform") for r in rows
                if engine in (r.capabilities or {}).get("engines", [])}

    async def capabilities_offering(self, conn: Connection, engine: str) -> dict[str, dict[str, Any]]:
        """Map each registered runtime (any status) that lists `engine` to the capabilities it reported."""
        rows = (await conn.execute(_OFFERS)).all()
        return {r.name: dict(r.capabilities or {}) for r in rows if engine in (r.capabilities or {}).get("engines", [])}

    async def owner_name(self, conn: Connection, principal_id: str) -> str | None:
        """Return the name of the principal that owns a runtime (to say who holds a name)."""
        return (await conn.execute(sa.select(principals.c.name).where(principals.c.id == principal_id))).scalar()

    async def register(self, conn: Connection, *, runtime_id: str | None, name: str, principal_id: str,
                       capabilities: dict[str, Any], slots: int, shared: bool, connection_id: str,
                       now: datetime, token_id: str | None = None) -> str:
        """Mark the runtime online under `connection_id` with its latest capabilities and slots, bound to the token
        `token_id` that registered it, inserting it when `runtime_id` is None; return its id. A concurrent first
        registration of `name` raises RegistrationRace."""
        values = dict(capabilities=capabilities, slots=slots, status="online", connection_id=connection_id,
                      last_seen_at=now, shared=shared, token_id=token_id)
        if runtime_id is not None:
            await conn.execute(runtimes.update().where(runtimes.c.id == runtime_id).values(**values))
            return runtime_id
        new = new_id("rt")
        try:
            await conn.execute(runtimes.insert().values(id=new, name=name, principal_id=principal_id,
                                                        registered_at=now, **values))
        except IntegrityError as e:
            raise RegistrationRace(name) from e
        return new

    async def heartbeat(self, conn: Connection, runtime_id: str, connection_id: str, now: datetime) -> None:
        """Record that the runtime is alive and online — only while `connection_id` is its current connection."""
        await conn.execute(_HEARTBEAT, {"b_runtime_id": runtime_id, "b_connection_id": connection_id, "b_now": now})

    async def mark_offline(self, conn: Connection, runtime_id: str, connection_id: str) -> None:
        """Mark the runtime offline — only if `connection_id` is still its current connection (a newer one wins)."""
        await conn.execute(runtimes.update().where(runtimes.c.id == runtime_id,
                                                   runtimes.c.connection_id == connection_id)
                           .values(status="offline", connection_id=None))

    async def connection(self, conn: Connection, runtime_id: str) -> tuple[str | None, dict[str, Any]]:
        """Return the runtime's current connection id and capabilities (the runtime must exist)."""
        current, caps = (await conn.execute(sa.select(runtimes.c.connection_id, runtimes.c.capabilities)
                                            .where(runtimes.c.id == runtime_id))).one()
        return current, caps

    async def open_reservations(self, conn: Connection, runtime_id: str) -> int:
        """Count the runtime's reservations not yet released."""
        return int((await conn.execute(sa.select(sa.func.count()).select_from(reservations).where(
            reservations.c.runtime_id == runtime_id, reservations.c.state != "released"))).scalar_one())

    async def delete(self, conn: Connection, runtime_id: str) -> None:
        """Delete the runtime and its (released) reservations, freeing its name."""
        await conn.execute(reservations.delete().where(reservations.c.runtime_id == runtime_id))
        await conn.execute(runtimes.delete().where(runtimes.c.id == runtime_id))

    async def count_by_status(self, conn: Connection) -> dict[str, int]:
        """Count runtimes per status; statuses without runtimes are absent."""
        return {status: int(n) for status, n in (await conn.execute(
            sa.select(runtimes.c.status, sa.func.count()).group_by(runtimes.c.status))).all()}

    # --- runs a runtime holds --------------------------------------------------------------------------------

    async def runs_on(self, conn: Connection, runtime_id: str) -> list[Row]:
        """Return the runs dispatched to or running on the runtime: id, status, attempt."""
        return list((await conn.execute(sa.select(task_runs.c.id, task_runs.c.status, task_runs.c.attempt).where(
            task_runs.c.runtime_id == runtime_id, among(task_runs.c.status, ON_RUNTIME)))).all())

    async def placement_of(self, conn: Connection, task_id: str) -> Row | None:
        """Return where a run is placed: runtime_id, attempt, status, error; None for an unknown run."""
        return (await conn.execute(sa.select(task_runs.c.runtime_id, task_runs.c.attempt, task_runs.c.status,
                                             task_runs.c.error).where(task_runs.c.id == task_id))).first()

    async def held_run(self, conn: Connection, runtime_id: str, task_id: str, attempt: int) -> Row | None:
        """Return the run (`HELD_COLUMNS`), locked until the transaction ends, only when this runtime holds this
        attempt of it."""
        rows = (await run(conn, self._held, {"b_task_id": task_id})).rows
        row = rows[0] if rows else None
        if row is None or row.runtime_id != runtime_id or row.attempt != attempt:
            return None
        return row

    async def held_runs(self, conn: Connection, task_ids: Collection[str]) -> dict[str, Row]:
        """Return these runs (`HELD_COLUMNS`) by id, locked until the transaction ends, in id order; which runtime
        and attempt hold each is the caller's to check (`held_run` checks one)."""
        if not task_ids:
            return {}
        return {r.id: r for r in (await run(conn, self._held_many, {"b_task_ids": sorted(set(task_ids))})).rows}

    async def resend_dispatch(self, conn: Connection, task_id: str) -> None:
        """Forget that the run's pending dispatch was sent, so the runtime's next connection sends it again."""
        await conn.execute(reservations.update().where(
            reservations.c.task_id == task_id, reservations.c.state == "pending").values(sent_at=None))

    async def start_run(self, conn: Connection, task_id: str, attempt: int, now: datetime) -> None:
        """Mark a dispatched run running, then commit its pending reservation of `attempt` — the task row first,
        then the reservation: the reaper takes them in this order too (the opposite deadlocked on PostgreSQL)."""
        await run(conn, _START_TASK, {"b_task_id": task_id, "b_now": now})
        await run(conn, _COMMIT_RESERVATION, {"b_task_id": task_id, "b_attempt": attempt})

    async def current_run_of_session(self, conn: Connection, session_id: str) -> str | None:
        """Return the session's latest dispatched or running run (its running turn), or None."""
        return (await conn.execute(sa.select(task_runs.c.id).where(
            task_runs.c.session_id == session_id, among(task_runs.c.status, ON_RUNTIME))
            .order_by(task_runs.c.turn_seq.desc()).limit(1))).scalar()

    # --- what a connection sends -------------------------------------------------------------------------------

    async def runner_token_live(self, conn: Connection, token_id: str) -> bool:
        """Say whether the connection's token still exists unrevoked (a revocation on any replica counts)."""
        return token_id in await self.live_tokens(conn, [token_id])

    async def live_tokens(self, conn: Connection, token_ids: list[str]) -> set[str]:
        """Return those of `token_ids` that still exist unrevoked (a revocation on any replica counts)."""
        if not token_ids:
            return set()
        return {r.id for r in (await run(conn, _LIVE_TOKENS, {"b_ids": sorted(set(token_ids))})).rows}

    async def connections(self, conn: Connection,
                          runtime_ids: list[str]) -> dict[str, tuple[str | None, dict[str, Any]]]:
        """Return each known runtime's current connection id and capabilities; deregistered ones are absent."""
        if not runtime_ids:
            return {}
        return {r.id: (r.connection_id, r.capabilities) for r in await conn.execute(
            sa.select(runtimes.c.id, runtimes.c.connection_id, runtimes.c.capabilities)
            .where(one_of(runtimes.c.id, set(runtime_ids))))}

    async def claim_dispatches(self, conn: Connection, runtime_ids: list[str], now: datetime) -> list[Row]:
        """Return the runtimes' pending, unsent reservations of dispatched runs (reservation id, runtime_id, task_id,
        attempt, prompt, snapshot, owner_id, session_id, kind), oldest first, and mark them sent, so each is sent once
        per connection."""
        if not runtime_ids:
            return []
        pending = list((await conn.execute(
            sa.select(reservations.c.id, reservations.c.runtime_id, task_runs.c.id.label("task_id"),
                      task_runs.c.attempt, task_runs.c.prompt, task_runs.c.snapshot, task_runs.c.owner_id,
                      task_runs.c.session_id, task_runs.c.kind)
            .join(task_runs, task_runs.c.id == reservations.c.task_id)
            .where(one_of(reservations.c.runtime_id, set(runtime_ids)), reservations.c.state == "pending",
                   reservations.c.sent_at.is_(None), task_runs.c.status == Status.DISPATCHED.value)
            .order_by(reservations.c.created_at, reservations.c.id))).all())
        if pending:
            await conn.execute(reservations.update().where(one_of(reservations.c.id, [r.id for r in pending]))
                               .values(sent_at=now))
        return pending

    async def claimable(self, conn: Connection, runtime_ids: list[str]) -> bool:
        """Say whether the runtimes have anything a pump round claims: an unsent dispatch, permission answer or
        steer (what `claim_dispatches`, `claim_permission_answers` and `claim_steers` would return)."""
        return bool((await conn.execute(_CLAIMABLE, {"b_ids": sorted(set(runtime_ids))})).scalar())

    async def cancels_due(self, conn: Connection, runtime_ids: list[str]) -> list[Row]:
        """Return the runtimes' running runs whose cancellation was requested: runtime_id, task_id."""
        if not runtime_ids:
            return []
        return list((await conn.execute(sa.select(task_runs.c.runtime_id, task_runs.c.id.label("task_id")).where(
            one_of(task_runs.c.runtime_id, set(runtime_ids)), task_runs.c.status == Status.RUNNING.value,
            task_runs.c.cancel_requested_at.is_not(None)))).all())

    async def claim_permission_answers(self, conn: Connection, runtime_ids: list[str], now: datetime) -> list[Row]:
        """Return the unsent permission answers for the runtimes' running runs (runtime_id, task_id, request_id,
        allow, message) and mark them sent."""
        if not runtime_ids:
            return []
        answers = list((await conn.execute(
            sa.select(task_runs.c.runtime_id, permission_replies.c.task_id, permission_replies.c.request_id,
                      permission_replies.c.allow, permission_replies.c.message)
            .join(task_runs, task_runs.c.id == permission_replies.c.task_id).where(
                one_of(task_runs.c.runtime_id, set(runtime_ids)), task_runs.c.status == Status.RUNNING.value,
                permission_replies.c.sent_at.is_(None)))).all())
        for a in answers:
            await conn.execute(permission_replies.update().where(
                permission_replies.c.task_id == a.task_id, permission_replies.c.request_id == a.request_id)
                .values(sent_at=now))
        return answers

    async def claim_steers(self, conn: Connection, runtime_ids: list[str], now: datetime) -> list[Row]:
        """Return the pending, unsent steer messages for runs on the runtimes (id, runtime_id, task_id, text),
        oldest first, and mark them sent."""
        if not runtime_ids:
            return []
        steers = list((await conn.execute(
            sa.select(mailbox.c.id, task_runs.c.runtime_id, mailbox.c.task_id, mailbox.c.text)
            .join(task_runs, task_runs.c.id == mailbox.c.task_id)
            .where(mailbox.c.kind == "steer", mailbox.c.state == "pending", mailbox.c.sent_at.is_(None),
                   one_of(task_runs.c.runtime_id, set(runtime_ids)))
            .order_by(mailbox.c.created_at, mailbox.c.id))).all())
        if steers:
            await conn.execute(mailbox.update().where(one_of(mailbox.c.id, [st.id for st in steers]))
                               .values(sent_at=now))
        return steers

    async def settle_steer(self, conn: Connection, steer_id: str, task_id: str, delivered: bool,
                           now: datetime, note: str | None = None) -> None:
        """Settle a pending steer: taken by the running turn `task_id`, or back to the mailbox (queued, no task,
        `note` saying why the turn could not take it) for a later wake; a steer settled already stays as it is."""
        await conn.execute(mailbox.update().where(mailbox.c.id == steer_id, mailbox.c.state == "pending")
                           .values(state="delivered" if delivered else "queued", settled_at=now,
                                   task_id=task_id if delivered else None,
                                   note=None if delivered or not note else note[:1000]))

    # --- sessions a runtime serves -----------------------------------------------------------------------------

    async def stick_session(self, conn: Connection, session_id: str, runtime_id: str) -> None:
        """Make the session's runtime the one of its first run; a session that has one keeps it."""
        await conn.execute(sessions.update().where(sessions.c.id == session_id, sessions.c.runtime_id.is_(None))
                           .values(runtime_id=runtime_id))

    async def record_resume_handle(self, conn: Connection, session_id: str, handle: str, now: datetime) -> None:
        """Store the provider's resume handle a session's run reported, for its next turn."""
        await conn.execute(sessions.update().where(sessions.c.id == session_id)
                           .values(resume_handle=handle, updated_at=now))

    async def memory_scope(self, conn: Connection, session_id: str) -> str | None:
        """Return the session's bound memory scope (None before its first launch)."""
        return (await conn.execute(sa.select(sessions.c.memory_scope).where(sessions.c.id == session_id))).scalar()

    async def bind_memory_scope(self, conn: Connection, session_id: str, scope: str | None) -> None:
        """Store the memory scope the session's first launch bound."""
        await conn.execute(sessions.update().where(sessions.c.id == session_id).values(memory_scope=scope))

    # --- placement -----------------------------------------------------------------------------------------------

    async def active_runs_by_owner(self, conn: Connection) -> dict[str, int]:
        """Count dispatched and running runs per owner; owners without any are absent."""
        counts: dict[str, int] = {}
        for (owner, _), n in (await self.active_runs_by_owner_and_runtime(conn)).items():
            counts[owner] = counts.get(owner, 0) + n
        return counts

    async def active_runs_by_owner_and_runtime(self, conn: Connection) -> dict[tuple[str, str], int]:
        """Count dispatched and running runs per (owner, runtime); pairs without any are absent."""
        return {(r.owner_id, r.runtime_id): int(r.n) for r in (await run(conn, _RUNS_BY_OWNER)).rows}

    async def any_queued(self) -> bool:
        """Say whether any run is queued, read alone outside any transaction (an index probe)."""
        return bool(await self.db.hot_read(_ANY_QUEUED))

    async def queue_heads(self, conn: Connection, per_owner: int) -> list[Row]:
        """Return each owner's `per_owner` oldest queued runs: id, owner_id, created_at and `place`, the run's
        position in its owner's own queue (1 = oldest)."""
        return (await run(conn, _QUEUE_HEADS, {"per_owner": per_owner})).rows

    async def queue_heads_of(self, conn: Connection, owners: Collection[str], per_owner: int) -> list[Row]:
        """Return `queue_heads` of these owners only."""
        if not owners:
            return []
        return (await run(conn, _QUEUE_HEADS_OF, {"per_owner": per_owner, "b_owners": sorted(set(owners))})).rows

    async def lock_queued(self, conn: Connection, task_ids: list[str]) -> list[Row]:
        """Lock those of `task_ids` still queued, skipping rows another replica holds (PostgreSQL SKIP LOCKED):
        id, owner_id, snapshot, attempt, session_id, created_at, prompt, kind, in no set order."""
        return (await run(conn, self._lock_queued, {"b_task_ids": list(task_ids)})).rows

    async def admin_holders(self, conn: Connection, principal_ids: set[str]) -> set[str]:
        """Return those of `principal_ids` holding a live (unrevoked) admin token."""
        if not principal_ids:
            return set()
        return set((await conn.execute(sa.select(api_tokens.c.principal_id).distinct().where(
            one_of(api_tokens.c.principal_id, principal_ids), api_tokens.c.admin.is_(True),
            api_tokens.c.revoked_at.is_(None)))).scalars())

    async def busy_sessions(self, conn: Connection) -> set[str]:
        """Return the sessions that have a run dispatched or running (one run at a time per session)."""
        return set((await conn.execute(sa.select(task_runs.c.session_id).where(
            among(task_runs.c.status, ON_RUNTIME), task_runs.c.session_id.is_not(None)))).scalars())

    async def reserve(self, conn: Connection, placements: list[Placement], now: datetime,
                      expires_at: datetime, sent_on: Collection[str] = ()) -> None:
        """Insert a pending reservation per placement (expiring at `expires_at` unless committed; already sent at
        `now` when its runtime is in `sent_on`: the caller sends it) and mark each task dispatched to its runtime with
        its new attempt, deadline and runner sequence reset to 0."""
        if not placements:
            return
        await run_many(conn, _RESERVE, [
            {"b_id": new_id("res"), "b_runtime_id": pl.runtime_id, "b_task_id": pl.task_id, "b_attempt": pl.attempt,
             "b_now": now, "b_expires_at": expires_at, "b_sent_at": now if pl.runtime_id in sent_on else None}
            for pl in placements])
        await run_many(conn, _MARK_DISPATCHED, [
            {"b_task_id": pl.task_id, "b_runtime_id": pl.runtime_id, "b_attempt": pl.attempt, "b_now": now,
             "b_deadline_at": pl.deadline_at} for pl in placements])

    # --- the reaper ----------------------------------------------------------------------------------------------

    async def anything_to_reap(self, now: datetime, lost_before: datetime, overdue_before: datetime,
                               queued_before: datetime) -> bool:
        """Say, in one read outside any transaction, whether the reaper has anything to look at: a pending
        reservation past its TTL (`release_expired`), a runtime silent since `lost_before` (`silent_since`), a run
        past its deadline before `overdue_before` (`overdue`), or a run queued since `queued_before`
        (`queued_since`)."""
        (row,) = await self.db.hot_read(_ANYTHING_TO_REAP, {
            "b_now": now, "b_lost_before": lost_before, "b_overdue_before": overdue_before,
            "b_queued_before": queued_before})
        return bool(row.due)

    async def release_expired(self, conn: Connection, now: datetime) -> list[ExpiredReservation]:
        """Release every pending reservation past its TTL and requeue its task while it is still dispatched.

        Per reservation the task row first, then the reservation: the order a runner's acceptance takes them in
        (`start_run`), so the two never deadlock on PostgreSQL.
        """
        expired = (await conn.execute(
            sa.select(reservations.c.id, reservations.c.task_id)
            .where(reservations.c.state == "pending", reservations.c.expires_at < now))).all()
        out = []
        for res in expired:
            moved = await conn.execute(task_runs.update().where(
                task_runs.c.id == res.task_id, task_runs.c.status == Status.DISPATCHED.value)
                .values(status=Status.QUEUED.value, runtime_id=None))
            await conn.execute(reservations.update()
                               .where(reservations.c.id == res.id, reservations.c.state == "pending")
                               .values(state="released", released_at=now))
            out.append(ExpiredReservation(res.task_id, moved.rowcount > 0))
        return out

    async def silent_since(self, conn: Connection, before: datetime) -> list[str]:
        """Return the online or offline runtimes last seen before `before`."""
        return list((await conn.execute(sa.select(runtimes.c.id).where(
            among(runtimes.c.status, ["online", "offline"]), runtimes.c.last_seen_at < before))).scalars())

    async def mark_lost(self, conn: Connection, runtime_id: str) -> None:
        """Mark the runtime lost and forget its connection."""
        await conn.execute(runtimes.update().where(runtimes.c.id == runtime_id)
                           .values(status="lost", connection_id=None))

    async def active_run_ids(self, conn: Connection, runtime_id: str) -> list[str]:
        """Return the ids of runs dispatched to or running on the runtime."""
        return list((await conn.execute(sa.select(task_runs.c.id).where(
            task_runs.c.runtime_id == runtime_id, among(task_runs.c.status, ON_RUNTIME)))).scalars())

    async def active_runs(self, conn: Connection, runtime_id: str) -> list[tuple[str, str]]:
        """Return (id, status) of the runs dispatched to or running on the runtime."""
        return [(r.id, r.status) for r in (await conn.execute(sa.select(task_runs.c.id, task_runs.c.status).where(
            task_runs.c.runtime_id == runtime_id, among(task_runs.c.status, ON_RUNTIME)))).all()]

    async def requeue_unstarted(self, conn: Connection, task_id: str, now: datetime) -> bool:
        """Put a dispatched run that never started back in the queue and release its pending reservation (the task
        row first, then the reservation, as every writer); False when it was no longer dispatched."""
        moved = await conn.execute(task_runs.update().where(
            task_runs.c.id == task_id, task_runs.c.status == Status.DISPATCHED.value)
            .values(status=Status.QUEUED.value, runtime_id=None))
        await conn.execute(reservations.update().where(reservations.c.task_id == task_id,
                                                       reservations.c.state == "pending")
                           .values(state="released", released_at=now))
        return moved.rowcount > 0

    async def overdue(self, conn: Connection, before: datetime) -> list[str]:
        """Return the dispatched or running runs whose deadline passed before `before`."""
        return list((await conn.execute(sa.select(task_runs.c.id).where(
            among(task_runs.c.status, ON_RUNTIME), task_runs.c.deadline_at < before))).scalars())

    async def queued_since(self, conn: Connection, before: datetime, limit: int = 500) -> list[Row]:
        """Return up to `limit` runs queued since before `before`: id, owner_id, snapshot."""
        return list((await conn.execute(sa.select(task_runs.c.id, task_runs.c.owner_id, task_runs.c.snapshot).where(
            task_runs.c.status == Status.QUEUED.value, task_runs.c.created_at < before).limit(limit))).all())
