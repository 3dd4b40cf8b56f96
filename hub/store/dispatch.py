"""Placement (queued → reserved), what each runner connection is sent (dispatches, steers, answers, cancels),
and the reaper."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Collection

import sqlalchemy as sa

from ..domain.tasks import Status
from ..ids import new_id
from .db import Connection, Database, Row, among, execute_many, one_of
from .registry import ACTIVE_RES, ON_RUNTIME
from .tables import TS, api_tokens, mailbox, permission_replies, reservations, runtimes, task_runs

# A placement round's writes: a pending reservation per placement, and each task marked dispatched (executemany).
_RESERVE = (reservations.insert().values(
    id=sa.bindparam("b_id"), runtime_id=sa.bindparam("b_runtime_id"), task_id=sa.bindparam("b_task_id"),
    attempt=sa.bindparam("b_attempt"), state="pending", created_at=sa.bindparam("b_now", type_=TS),
    expires_at=sa.bindparam("b_expires_at", type_=TS), sent_at=sa.bindparam("b_sent_at", type_=TS)))
_MARK_DISPATCHED = (task_runs.update().where(task_runs.c.id == sa.bindparam("b_task_id")).values(
    status=Status.DISPATCHED.value, runtime_id=sa.bindparam("b_runtime_id"), attempt=sa.bindparam("b_attempt"),
    last_rseq=0, dispatched_at=sa.bindparam("b_now", type_=TS), deadline_at=sa.bindparam("b_deadline_at", type_=TS)))
# Each placement round's reads.
_RUNS_BY_OWNER = (sa.select(task_runs.c.owner_id, task_runs.c.runtime_id, sa.func.count().label("n"))
                         .where(among(task_runs.c.status, ON_RUNTIME))
                         .group_by(task_runs.c.owner_id, task_runs.c.runtime_id))
_RANKED = (sa.select(task_runs.c.id, task_runs.c.owner_id, task_runs.c.created_at,
                     sa.func.row_number().over(partition_by=task_runs.c.owner_id,
                                               order_by=task_runs.c.created_at).label("place"))
           .where(task_runs.c.status == Status.QUEUED.value))
_QUEUED_ALL = _RANKED.subquery()
_QUEUE_HEADS = (sa.select(_QUEUED_ALL).where(_QUEUED_ALL.c.place <= sa.bindparam("per_owner")))
_QUEUED_OF = _RANKED.where(one_of(task_runs.c.owner_id, "b_owners")).subquery()  # some owners' only
_QUEUE_HEADS_OF = (sa.select(_QUEUED_OF).where(_QUEUED_OF.c.place <= sa.bindparam("per_owner")))
_USED = (sa.select(reservations.c.runtime_id, sa.func.count().label("n"))
         .where(among(reservations.c.state, ACTIVE_RES)).group_by(reservations.c.runtime_id).subquery())
_ONLINE_USED = (sa.select(runtimes, sa.func.coalesce(_USED.c.n, 0).label("used"))
                       .select_from(runtimes.outerjoin(_USED, _USED.c.runtime_id == runtimes.c.id))
                       .where(runtimes.c.status == "online").order_by(runtimes.c.id))
_ANY_QUEUED = (sa.select(task_runs.c.id).where(task_runs.c.status == Status.QUEUED.value).limit(1))
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
_ANYTHING_TO_REAP = (sa.select(sa.or_(
    sa.select(reservations.c.id).where(reservations.c.state == "pending",
                                       reservations.c.expires_at < sa.bindparam("b_now")).exists(),
    sa.select(runtimes.c.id).where(among(runtimes.c.status, ["online", "offline"]),
                                   runtimes.c.last_seen_at < sa.bindparam("b_lost_before")).exists(),
    sa.select(task_runs.c.id).where(among(task_runs.c.status, ON_RUNTIME),
                                    task_runs.c.deadline_at < sa.bindparam("b_overdue_before")).exists(),
    sa.select(task_runs.c.id).where(task_runs.c.status == Status.QUEUED.value,
                                    task_runs.c.created_at < sa.bindparam("b_queued_before")).exists()).label("due")))
_LOCK_QUEUED = (sa.select(task_runs.c.id, task_runs.c.owner_id, task_runs.c.snapshot, task_runs.c.attempt,
                          task_runs.c.session_id, task_runs.c.created_at, task_runs.c.prompt, task_runs.c.kind)
                .where(one_of(task_runs.c.id, "b_task_ids"), task_runs.c.status == Status.QUEUED.value))


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


class SqlDispatchStore:
    """Capacity (`reservations`), placement's reads and writes, what a connection is due, and the reaper's."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._lock_queued = db.for_update(_LOCK_QUEUED, skip_locked=True)

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
        """Return the runtimes' running runs whose cancellation was requested: runtime_id, task_id, attempt."""
        if not runtime_ids:
            return []
        return list((await conn.execute(sa.select(task_runs.c.runtime_id, task_runs.c.id.label("task_id"),
                                                  task_runs.c.attempt).where(
            one_of(task_runs.c.runtime_id, set(runtime_ids)), task_runs.c.status == Status.RUNNING.value,
            task_runs.c.cancel_requested_at.is_not(None)))).all())

    async def claim_permission_answers(self, conn: Connection, runtime_ids: list[str], now: datetime) -> list[Row]:
        """Return the unsent permission answers for the runtimes' running runs (runtime_id, task_id, attempt,
        request_id, allow, message) and mark them sent."""
        if not runtime_ids:
            return []
        answers = list((await conn.execute(
            sa.select(task_runs.c.runtime_id, permission_replies.c.task_id, task_runs.c.attempt,
                      permission_replies.c.request_id, permission_replies.c.allow, permission_replies.c.message)
            .join(task_runs, task_runs.c.id == permission_replies.c.task_id).where(
                one_of(task_runs.c.runtime_id, set(runtime_ids)), task_runs.c.status == Status.RUNNING.value,
                permission_replies.c.sent_at.is_(None)))).all())
        for a in answers:
            await conn.execute(permission_replies.update().where(
                permission_replies.c.task_id == a.task_id, permission_replies.c.request_id == a.request_id)
                .values(sent_at=now))
        return answers

    async def claim_steers(self, conn: Connection, runtime_ids: list[str], now: datetime) -> list[Row]:
        """Return the pending, unsent steer messages for runs on the runtimes (id, runtime_id, task_id, attempt,
        text), oldest first, and mark them sent."""
        if not runtime_ids:
            return []
        steers = list((await conn.execute(
            sa.select(mailbox.c.id, task_runs.c.runtime_id, mailbox.c.task_id, task_runs.c.attempt, mailbox.c.text)
            .join(task_runs, task_runs.c.id == mailbox.c.task_id)
            .where(mailbox.c.kind == "steer", mailbox.c.state == "pending", mailbox.c.sent_at.is_(None),
                   one_of(task_runs.c.runtime_id, set(runtime_ids)))
            .order_by(mailbox.c.created_at, mailbox.c.id))).all())
        if steers:
            await conn.execute(mailbox.update().where(one_of(mailbox.c.id, [st.id for st in steers]))
                               .values(sent_at=now))
        return steers

    async def online(self, conn: Connection) -> list[Row]:
        """Return the online runtimes, by id, each with `used`: its active (pending or committed) reservations."""
        return list((await conn.execute(_ONLINE_USED)).all())

    async def active_runs_by_owner(self, conn: Connection) -> dict[str, int]:
        """Count dispatched and running runs per owner; owners without any are absent."""
        counts: dict[str, int] = {}
        for (owner, _), n in (await self.active_runs_by_owner_and_runtime(conn)).items():
            counts[owner] = counts.get(owner, 0) + n
        return counts

    async def active_runs_by_owner_and_runtime(self, conn: Connection) -> dict[tuple[str, str], int]:
        """Count dispatched and running runs per (owner, runtime); pairs without any are absent."""
        return {(r.owner_id, r.runtime_id): int(r.n) for r in list((await conn.execute(_RUNS_BY_OWNER)).all())}

    async def any_queued(self) -> bool:
        """Say whether any run is queued, read alone outside any transaction (an index probe)."""
        async with self.db.read() as conn:
            return (await conn.execute(_ANY_QUEUED)).first() is not None

    async def queue_heads(self, conn: Connection, per_owner: int) -> list[Row]:
        """Return each owner's `per_owner` oldest queued runs: id, owner_id, created_at and `place`, the run's
        position in its owner's own queue (1 = oldest)."""
        return list((await conn.execute(_QUEUE_HEADS, {"per_owner": per_owner})).all())

    async def queue_heads_of(self, conn: Connection, owners: Collection[str], per_owner: int) -> list[Row]:
        """Return `queue_heads` of these owners only."""
        if not owners:
            return []
        return list((await conn.execute(_QUEUE_HEADS_OF, {"per_owner": per_owner,
                                                          "b_owners": sorted(set(owners))})).all())

    async def lock_queued(self, conn: Connection, task_ids: list[str]) -> list[Row]:
        """Lock those of `task_ids` still queued, skipping rows another replica holds (PostgreSQL SKIP LOCKED):
        id, owner_id, snapshot, attempt, session_id, created_at, prompt, kind, in no set order."""
        return list((await conn.execute(self._lock_queued, {"b_task_ids": list(task_ids)})).all())

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
        await execute_many(conn, _RESERVE, [
            {"b_id": new_id("res"), "b_runtime_id": pl.runtime_id, "b_task_id": pl.task_id, "b_attempt": pl.attempt,
             "b_now": now, "b_expires_at": expires_at, "b_sent_at": now if pl.runtime_id in sent_on else None}
            for pl in placements])
        await execute_many(conn, _MARK_DISPATCHED, [
            {"b_task_id": pl.task_id, "b_runtime_id": pl.runtime_id, "b_attempt": pl.attempt, "b_now": now,
             "b_deadline_at": pl.deadline_at} for pl in placements])

    async def anything_to_reap(self, now: datetime, lost_before: datetime, overdue_before: datetime,
                               queued_before: datetime) -> bool:
        """Say, in one read outside any transaction, whether the reaper has anything to look at: a pending
        reservation past its TTL (`release_expired`), a runtime silent since `lost_before` (`silent_since`), a run
        past its deadline before `overdue_before` (`overdue`), or a run queued since `queued_before`
        (`queued_since`)."""
        async with self.db.read() as conn:
            return bool((await conn.execute(_ANYTHING_TO_REAP, {
                "b_now": now, "b_lost_before": lost_before, "b_overdue_before": overdue_before,
                "b_queued_before": queued_before})).scalar_one())

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

    async def mark_lost(self, conn: Connection, runtime_id: str, before: datetime) -> bool:
        """Mark the runtime lost and forget its connection, if it is still silent since before `before`; return
        whether it was. The statement checks again: a heartbeat committed since `silent_since` read it wins."""
        lost = await conn.execute(runtimes.update().where(
            runtimes.c.id == runtime_id, among(runtimes.c.status, ["online", "offline"]),
            runtimes.c.last_seen_at < before).values(status="lost", connection_id=None))
        return lost.rowcount > 0

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
