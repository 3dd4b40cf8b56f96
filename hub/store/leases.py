"""Lease tasks, the boxes inside them, and the Boxes page's sign-in sessions.

A task is held by whoever presents the secret whose SHA-256 is its `secret_hash`: minting a new hash is
how a lease changes hands, and dropping it (release, close) leaves the task unheld.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from operator import attrgetter
from typing import Any, NamedTuple

import sqlalchemy as sa

from .db import Connection, Database
from .records import record, records
from .tables import api_tokens, box_sessions, boxes, lease_tasks, principals

LIVE = ("creating", "live")  # box states that still hold resources


def _live(state: sa.ColumnElement[str]) -> sa.ColumnElement[bool]:
    """Say a box state holds resources, as plain equalities: `IN (...)` expands its list at every execution."""
    return sa.or_(*(state == s for s in LIVE))


_B = boxes.alias("b")
_BOX_KEYS = tuple((c.name, f"box_{c.name}") for c in boxes.c)  # a Box's fields and their labels in a joined row
_t = lease_tasks.c
# what the lease gate reads of a task (hub/services/leases/service.py `_check`)
_GATE = (_t.id, _t.owner_id, _t.status, _t.closed_reason, _t.secret_hash, _t.holder_label, _t.attached_at,
         _t.last_activity_at, _t.created_at)
_LEASE_WITH_BOXES = (
    sa.select(*_GATE, *(c.label(f"box_{c.name}") for c in _B.c))
    .select_from(lease_tasks.outerjoin(_B, (_B.c.task_id == lease_tasks.c.id) & _live(_B.c.state)))
    .where(lease_tasks.c.id == sa.bindparam("task_id")).order_by(_B.c.created_at, _B.c.id)
)


def _page_of_open_tasks(direction: str) -> sa.Select:
    """Build the Boxes page's one statement: a page of an owner's open tasks (keyed on last activity, id), their
    live boxes, and the count of all the owner's open tasks (kept on a row of its own when the page is empty).
    Its columns, in the order `open_tasks_page` unpacks them: the count, the task's six, the box's six."""
    t, b = lease_tasks.c, boxes.c
    mine = (t.owner_id == sa.bindparam("owner_id")) & (t.status == "open")
    page = sa.select(t.id, t.name, t.holder_label, t.secret_hash.is_not(None).label("held"), t.attached_at,
                     t.last_activity_at).where(mine)
    at, tid = sa.bindparam("at", type_=t.last_activity_at.type), sa.bindparam("task_id", type_=t.id.type)
    if direction == "before":
        page = page.where((t.last_activity_at > at) | ((t.last_activity_at == at) & (t.id > tid)))
        page = page.order_by(t.last_activity_at, t.id)
    else:
        if direction == "after":
            page = page.where((t.last_activity_at < at) | ((t.last_activity_at == at) & (t.id < tid)))
        page = page.order_by(t.last_activity_at.desc(), t.id.desc())
    p = page.limit(sa.bindparam("size", type_=sa.Integer)).subquery("p")
    total = sa.select(sa.select(sa.func.count()).select_from(lease_tasks).where(mine).scalar_subquery()
                      .label("open_tasks")).subquery("total")
    return (sa.select(total.c.open_tasks, p.c.id, p.c.name, p.c.holder_label, p.c.held, p.c.attached_at,
                      p.c.last_activity_at, b.id.label("box_id"), b.name.label("box_name"),
                      b.driver.label("box_driver"), b.state.label("box_state"), b.created_at.label("box_created_at"),
                      b.handle.label("box_handle"))
            .select_from(total.outerjoin(p, sa.true()).outerjoin(boxes, (b.task_id == p.c.id) & _live(b.state)))
            .order_by(p.c.last_activity_at.desc(), p.c.id.desc(), b.created_at, b.id))


_PAGE_FIRST, _PAGE_AFTER, _PAGE_BEFORE = (_page_of_open_tasks(d) for d in ("first", "after", "before"))
_BOX_SESSION = (  # built once: the Boxes page resolves its cookie on every load
    sa.select(box_sessions, principals.c.name, api_tokens.c.label, api_tokens.c.admin, api_tokens.c.kind,
              api_tokens.c.revoked_at.label("token_revoked_at"))
    .join(principals, principals.c.id == box_sessions.c.principal_id)
    .join(api_tokens, api_tokens.c.id == box_sessions.c.token_id)
    .where(box_sessions.c.id == sa.bindparam("session_id"))
)

_LEASE_WITH_BOX = (
    sa.select(lease_tasks, *(c.label(f"box_{c.name}") for c in _B.c))
    .select_from(lease_tasks.outerjoin(_B, (_B.c.task_id == lease_tasks.c.id) & (_B.c.id == sa.bindparam("box_id"))))
    .where(lease_tasks.c.id == sa.bindparam("task_id"))
)


class PageTask(NamedTuple):
    """An open task as the Boxes page shows it: whether it is held, never its secret's hash (a tuple: a page builds
    fifty of them per load)."""

    id: str
    name: str
    holder_label: str | None
    held: bool
    attached_at: datetime | None
    last_activity_at: datetime


class PageBox(NamedTuple):
    """A live box as the Boxes page shows it; its driver handle only tells whether it still runs, and is never shown."""

    id: str
    task_id: str
    name: str | None
    driver: str
    state: str
    created_at: datetime
    handle: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class TaskPage:
    """One page of an owner's open tasks with their live boxes, and what the whole list holds."""

    tasks: list[PageTask]
    boxes: list[PageBox]
    more: bool            # more tasks lie beyond this page in the direction it was read
    open_tasks: int       # every open task of the owner, on every page


@dataclass(frozen=True, kw_only=True)
class LeaseGate:
    """What the lease gate reads of a task (hub/services/leases/service.py `_check`): who owns it, whether it is open
    and held, and by which secret's hash."""

    id: str
    owner_id: str
    status: str
    closed_reason: str | None
    secret_hash: str | None
    holder_label: str | None
    attached_at: datetime | None
    last_activity_at: datetime
    created_at: datetime


@dataclass(frozen=True, kw_only=True)
class LeaseTask(LeaseGate):
    """One lease task with every column of `lease_tasks`."""

    name: str
    holder_token_id: str | None
    released_at: datetime | None
    closed_at: datetime | None


@dataclass(frozen=True, kw_only=True)
class BoxLine:
    """A live box of an owner's open task as a listing shows it (no driver handle)."""

    id: str
    task_id: str
    name: str | None
    driver: str
    state: str
    created_at: datetime


@dataclass(frozen=True, kw_only=True)
class BoxSessionRecord:
    """A Boxes page session with its principal's name and what its API token says (revoking the token ends it)."""

    id: str
    principal_id: str
    token_id: str
    session_hash: str
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None
    name: str
    label: str | None
    admin: bool
    kind: str
    token_revoked_at: datetime | None


@dataclass(frozen=True, kw_only=True)
class Box:
    """One box with every column of `boxes`."""

    id: str
    task_id: str
    name: str | None
    driver: str
    state: str
    handle: dict[str, Any] | None
    created_at: datetime
    destroyed_at: datetime | None


_TASK_FIELDS = tuple(f.name for f in fields(LeaseTask))


class SqlLeaseStore:
    """Lease tasks and boxes; box sessions of the Boxes page."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # --- lease tasks -----------------------------------------------------------------------------

    async def task(self, conn: Connection, task_id: str, *, lock: bool = False) -> LeaseTask | None:
        """Return a lease task; `lock` holds it for this transaction, so attaches, releases and closes of one task
        run one after the other."""
        stmt = sa.select(lease_tasks).where(lease_tasks.c.id == task_id)
        return record(LeaseTask, (await conn.execute(self.db.for_update(stmt) if lock else stmt)).mappings().first())

    async def _written(self, conn: Connection, task_id: str) -> LeaseTask:
        """Return a task this transaction has just written."""
        row = (await conn.execute(sa.select(lease_tasks).where(lease_tasks.c.id == task_id))).mappings().one()
        return LeaseTask(**{name: row[name] for name in _TASK_FIELDS})

    async def task_with_live_boxes(self, conn: Connection, task_id: str) -> tuple[LeaseGate | None, list[Box]]:
        """Return what the lease gate reads of a task and its live boxes, oldest first, in one query (the hot path of
        `rift_vm_list`)."""
        rows = (await conn.execute(_LEASE_WITH_BOXES, {"task_id": task_id})).mappings().all()
        found = [Box(**{k: r[label] for k, label in _BOX_KEYS}) for r in rows if r["box_id"] is not None]
        return record(LeaseGate, rows[0] if rows else None), found

    async def task_with_box(self, conn: Connection, task_id: str,
                            box_id: str) -> tuple[LeaseTask | None, Box | None]:
        """Return a lease task and one of its boxes (in any state; None when the task has no such box), in one query
        (the hot path of every call on one box)."""
        row = (await conn.execute(_LEASE_WITH_BOX, {"task_id": task_id, "box_id": box_id})).mappings().first()
        task = record(LeaseTask, row)
        if row is None or row["box_id"] is None:
            return task, None
        return task, Box(**{k: row[label] for k, label in _BOX_KEYS})

    async def open_task(self, conn: Connection, *, task_id: str, owner_id: str, name: str, holder_label: str,
                        holder_token_id: str, secret_hash: str, now: datetime) -> LeaseTask:
        """Open a task held by the handle whose secret hashes to `secret_hash`; its clocks start at `now`."""
        await conn.execute(lease_tasks.insert().values(
            id=task_id, owner_id=owner_id, name=name, status="open", holder_label=holder_label,
            holder_token_id=holder_token_id, secret_hash=secret_hash, attached_at=now, last_activity_at=now,
            created_at=now))
        return await self._written(conn, task_id)

    async def touch(self, conn: Connection, task_id: str, secret_hash: str, now: datetime) -> None:
        """Move the task's activity clock to `now`, only while it is open and still held by the handle hashing to
        `secret_hash` (a stale handle is not activity; the caller decides how often a move is worth a write)."""
        await conn.execute(lease_tasks.update().where(
            lease_tasks.c.id == task_id, lease_tasks.c.secret_hash == secret_hash,
            lease_tasks.c.status == "open").values(last_activity_at=now))

    async def attach(self, conn: Connection, task_id: str, *, secret_hash: str, holder_label: str,
                     holder_token_id: str, now: datetime) -> LeaseTask:
        """Mint a new secret hash for the task, so the previous handle stops working; the new holder's clocks
        start at `now` and a release is forgotten."""
        await conn.execute(lease_tasks.update().where(lease_tasks.c.id == task_id).values(
            secret_hash=secret_hash, holder_label=holder_label, holder_token_id=holder_token_id,
            attached_at=now, last_activity_at=now, released_at=None))
        return await self._written(conn, task_id)

    async def release(self, conn: Connection, task_id: str, now: datetime) -> LeaseTask:
        """Drop the task's secret hash: its handle stops working and any of the owner's agents may attach without
        takeover; a release counts as activity."""
        await conn.execute(lease_tasks.update().where(lease_tasks.c.id == task_id).values(
            secret_hash=None, released_at=now, last_activity_at=now))
        return await self._written(conn, task_id)

    async def close(self, conn: Connection, task_id: str, now: datetime, reason: str) -> None:
        """Close the task for good and drop its secret hash (its boxes are destroyed after, by the caller or the
        reaper)."""
        await conn.execute(lease_tasks.update().where(lease_tasks.c.id == task_id).values(
            status="closed", closed_at=now, closed_reason=reason, secret_hash=None))

    async def close_quiet(self, conn: Connection, cutoff: datetime, now: datetime, reason: str, limit: int) -> int:
        """Close up to `limit` open tasks quiet since `cutoff`, quietest first, skipping rows other replicas hold;
        a task touched meanwhile stays open. Return how many closed."""
        due = (lease_tasks.c.status == "open") & (lease_tasks.c.last_activity_at <= cutoff)
        ids = [r.id for r in await conn.execute(self.db.for_update(
            sa.select(lease_tasks.c.id).where(due).order_by(lease_tasks.c.last_activity_at).limit(limit),
            skip_locked=True))]
        if not ids:
            return 0
        res = await conn.execute(lease_tasks.update().where(lease_tasks.c.id.in_(ids), due).values(
            status="closed", closed_at=now, secret_hash=None, closed_reason=reason))
        return res.rowcount

    async def lock_owner(self, conn: Connection, owner_id: str) -> None:
        """Hold the owner's principal row until the transaction ends, so its concurrent opens and box claims count
        one after another on PostgreSQL (SQLite's writers are serialized already)."""
        await conn.execute(self.db.for_update(sa.select(principals.c.id).where(principals.c.id == owner_id)))

    async def count_open_tasks(self, conn: Connection, owner_id: str) -> int:
        """Return how many of an owner's tasks are open."""
        return (await conn.execute(sa.select(sa.func.count()).select_from(lease_tasks).where(
            lease_tasks.c.owner_id == owner_id, lease_tasks.c.status == "open"))).scalar_one()

    async def count_owner_live_boxes(self, conn: Connection, owner_id: str) -> int:
        """Return how many boxes of an owner's tasks, open or closed, still hold resources (being made or live)."""
        return (await conn.execute(sa.select(sa.func.count()).select_from(
            boxes.join(lease_tasks, lease_tasks.c.id == boxes.c.task_id)).where(
            lease_tasks.c.owner_id == owner_id, _live(boxes.c.state)))).scalar_one()

    async def open_tasks(self, conn: Connection, owner_id: str) -> list[LeaseTask]:
        """Return an owner's open tasks, most recently active first."""
        return records(LeaseTask, (await conn.execute(
            sa.select(lease_tasks).where(lease_tasks.c.owner_id == owner_id, lease_tasks.c.status == "open")
            .order_by(lease_tasks.c.last_activity_at.desc(), lease_tasks.c.id))).mappings())

    async def open_tasks_page(self, conn: Connection, owner_id: str, size: int, *,
                              after: tuple[datetime, str] | None = None,
                              before: tuple[datetime, str] | None = None) -> TaskPage:
        """Return up to `size` of an owner's open tasks, most recently active first (ties: higher id first), with
        their live boxes oldest first and the count of all the owner's open tasks, in one query; `after` starts below
        the task with that (last activity, id) key, `before` reads the page above it. Keyed, not offset: a page stays
        the same while tasks open above it."""
        params: dict[str, Any] = {"owner_id": owner_id, "size": size + 1}
        if before is not None:
            stmt, (params["at"], params["task_id"]) = _PAGE_BEFORE, before
        elif after is not None:
            stmt, (params["at"], params["task_id"]) = _PAGE_AFTER, after
        else:
            stmt = _PAGE_FIRST
        rows = (await conn.execute(stmt, params)).all()
        tasks: dict[str, PageTask] = {}
        found: list[PageBox] = []
        for _, tid, name, holder, held, attached, active, box_id, box_name, driver, state, created, handle in rows:
            if tid is None:
                continue
            if tid not in tasks:
                tasks[tid] = PageTask(tid, name, holder, bool(held), attached, active)
            if box_id is not None:
                found.append(PageBox(box_id, tid, box_name, driver, state, created, handle))
        shown = list(tasks.values())
        more = len(shown) > size
        if more:  # the extra task only says there is more: it is the one furthest from where the page was read
            extra = shown.pop(0 if before is not None else -1)
            found = [x for x in found if x.task_id != extra.id]
        found.sort(key=attrgetter("created_at", "id"))
        return TaskPage(tasks=shown, boxes=found, more=more, open_tasks=rows[0][0])

    async def recently_closed(self, conn: Connection, owner_id: str, limit: int) -> list[LeaseTask]:
        """Return an owner's `limit` most recently closed tasks, newest first."""
        return records(LeaseTask, (await conn.execute(
            sa.select(lease_tasks).where(lease_tasks.c.owner_id == owner_id, lease_tasks.c.status == "closed")
            .order_by(lease_tasks.c.closed_at.desc()).limit(limit))).mappings())

    # --- boxes -----------------------------------------------------------------------------------

    async def live_boxes_of_open_tasks(self, conn: Connection, owner_id: str) -> list[BoxLine]:
        """Return the live boxes of an owner's open tasks, oldest first."""
        return records(BoxLine, (await conn.execute(
            sa.select(boxes.c.id, boxes.c.task_id, boxes.c.name, boxes.c.driver, boxes.c.state, boxes.c.created_at)
            .join(lease_tasks, lease_tasks.c.id == boxes.c.task_id)
            .where(lease_tasks.c.owner_id == owner_id, lease_tasks.c.status == "open", _live(boxes.c.state))
            .order_by(boxes.c.created_at, boxes.c.id))).mappings())

    async def live_box_ids(self, conn: Connection, task_id: str) -> list[str]:
        """Return the ids of a task's live boxes, oldest first."""
        return list((await conn.execute(sa.select(boxes.c.id).where(boxes.c.task_id == task_id, _live(boxes.c.state))
                                        .order_by(boxes.c.created_at, boxes.c.id))).scalars().all())

    async def count_live_boxes(self, conn: Connection, task_id: str) -> int:
        """Return how many boxes of a task still hold resources (being made or live)."""
        return (await conn.execute(sa.select(sa.func.count()).select_from(boxes).where(
            boxes.c.task_id == task_id, _live(boxes.c.state)))).scalar_one()

    async def add_box(self, conn: Connection, *, box_id: str, task_id: str, name: str | None, driver: str,
                      provisional: dict[str, Any], now: datetime) -> None:
        """Record a box as `creating` with its provisional handle before the driver makes it, so a box a crash
        catches half-made is still destroyed."""
        await conn.execute(boxes.insert().values(id=box_id, task_id=task_id, name=name, driver=driver,
                                                 state="creating", handle=provisional, created_at=now))

    async def box_made(self, conn: Connection, box_id: str, handle: dict[str, Any]) -> bool:
        """Mark a box live with the driver's handle, only while it is still `creating`; False when it stopped being
        (its task closed while the box was being made)."""
        res = await conn.execute(boxes.update().where(boxes.c.id == box_id, boxes.c.state == "creating")
                                 .values(state="live", handle=handle))
        return res.rowcount == 1

    async def box_failed(self, conn: Connection, box_id: str, now: datetime) -> None:
        """Mark a box the driver could not make as failed (it holds nothing any more)."""
        await conn.execute(boxes.update().where(boxes.c.id == box_id).values(state="failed", destroyed_at=now))

    async def mark_destroyed(self, conn: Connection, box_id: str, now: datetime) -> bool:
        """Mark a box destroyed while it is being made or live; False when it was not (another sweep was first)."""
        res = await conn.execute(boxes.update().where(boxes.c.id == box_id, _live(boxes.c.state))
                                 .values(state="destroyed", destroyed_at=now))
        return res.rowcount == 1

    async def box(self, conn: Connection, box_id: str, task_id: str | None = None) -> Box | None:
        """Return a box, in any state; with `task_id`, only when it belongs to that task."""
        stmt = sa.select(boxes).where(boxes.c.id == box_id)
        if task_id is not None:
            stmt = stmt.where(boxes.c.task_id == task_id)
        return record(Box, (await conn.execute(stmt)).mappings().first())

    async def live_boxes_of(self, conn: Connection, task_ids: list[str]) -> list[Box]:
        """Return the boxes of these tasks that still hold resources, oldest first."""
        return records(Box, (await conn.execute(sa.select(boxes).where(boxes.c.task_id.in_(task_ids),
                                                                       _live(boxes.c.state))
                                                .order_by(boxes.c.created_at))).mappings())

    async def stuck_boxes(self, conn: Connection, cutoff: datetime, limit: int) -> list[Box]:
        """Return up to `limit` boxes left `creating` since `cutoff` or before (their maker is gone), oldest first."""
        return records(Box, (await conn.execute(
            sa.select(boxes).where(boxes.c.state == "creating", boxes.c.created_at <= cutoff)
            .order_by(boxes.c.created_at).limit(limit))).mappings())

    async def closed_tasks_with_live_boxes(self, conn: Connection, limit: int) -> list[str]:
        """Return up to `limit` closed tasks that still have boxes holding resources (a closer died before
        destroying them)."""
        return list((await conn.execute(
            sa.select(boxes.c.task_id).distinct().join(lease_tasks, lease_tasks.c.id == boxes.c.task_id)
            .where(lease_tasks.c.status == "closed", _live(boxes.c.state)).limit(limit))).scalars().all())

    # --- Boxes page sessions ---------------------------------------------------------------------

    async def open_box_session(self, conn: Connection, *, session_id: str, principal_id: str, token_id: str,
                               session_hash: str, now: datetime, expires_at: datetime) -> None:
        """Store a Boxes page session by the hash of its secret, tied to the API token that opened it."""
        await conn.execute(box_sessions.insert().values(
            id=session_id, principal_id=principal_id, token_id=token_id, session_hash=session_hash,
            created_at=now, expires_at=expires_at))

    async def box_session(self, conn: Connection, session_id: str) -> BoxSessionRecord | None:
        """Return a session with its principal's `name` and its token's `label`, `admin`, `kind` and
        `token_revoked_at` (revoking the token ends the session); hash included, for a constant-time compare."""
        row = (await conn.execute(_BOX_SESSION, {"session_id": session_id})).mappings().first()
        return record(BoxSessionRecord, row)

    async def revoke_box_session(self, conn: Connection, session_id: str, session_hash: str, now: datetime) -> bool:
        """End a session when the secret's hash matches and it is still open; return whether it ended now."""
        res = await conn.execute(box_sessions.update().where(
            box_sessions.c.id == session_id, box_sessions.c.session_hash == session_hash,
            box_sessions.c.revoked_at.is_(None)).values(revoked_at=now))
        return res.rowcount == 1
