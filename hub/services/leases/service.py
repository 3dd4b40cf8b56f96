"""Lease tasks and their boxes: open, attach, release, close; boxes inside; the reaper that closes quiet lease tasks."""
from __future__ import annotations

import builtins
import hashlib
import hmac
import logging
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, TypeVar

from ...boxes.base import DEFAULT_EXEC_TIMEOUT_S, MAX_COMMAND_BYTES, MAX_EXEC_TIMEOUT_S, BoxDriver, BoxError
from ...clock import Clock, utc
from ...config import BoxSettings, LeaseSettings
from ...domain import leases as rules
from ...domain.durations import duration_text
from ...errors import Conflict, Invalid, NotFound, TooMany
from ...ids import short_id
from ...store.db import Connection, Database
from ...store.leases import Box, LeaseGate, LeaseTask, PageBox, PageTask, SqlLeaseStore
from ...store.ports.leases import LeaseStore
from ..auth.service import Caller

log = logging.getLogger(__name__)

RECENT_CLOSED = 10
REAP_BATCH = 100

G = TypeVar("G", bound=LeaseGate)


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _iso(dt: datetime | None) -> str | None:
    dt = utc(dt)
    return dt.isoformat().replace("+00:00", "Z") if dt else None


def holder_of(caller: Caller) -> str:
    """Return the holder name a lease shows: the attaching token's label (`mcp:Claude`)."""
    return caller.label or f"{caller.principal} (unlabeled token)"


def _parse(fn: Callable[[str | None], Any], raw: str | None) -> Any:
    try:
        return fn(raw)
    except rules.HandleError as e:
        raise Invalid(str(e)) from e


def task_view(row: Any, box_ids: list[str] | None = None) -> dict[str, Any]:
    """Render a lease task row for tools and pages (never the secret or its hash)."""
    held = row.status == "open" and row.secret_hash is not None
    return {
        "task_id": row.id, "name": row.name, "status": row.status,
        "holder": row.holder_label if held else None, "held": held,
        "last_holder": row.holder_label, "attached_at": _iso(row.attached_at),
        "last_activity_at": _iso(row.last_activity_at), "released_at": _iso(row.released_at),
        "closed_at": _iso(row.closed_at), "closed_reason": row.closed_reason,
        "created_at": _iso(row.created_at), "boxes": box_ids if box_ids is not None else [],
    }


def box_sandboxed(row: Any) -> bool:
    """Return whether a box runs isolated (every driver but the operator's explicit `unsandboxed`)."""
    return row.driver != "unsandboxed" and (row.handle or {}).get("sandbox") != "none"


def box_view(row: Any, *, dead: bool = False) -> dict[str, Any]:
    """Render a box row (the driver handle stays inside the hub; only how it is isolated shows); `dead`: listed live,
    but its driver says it no longer runs."""
    handle = row.handle or {}
    sandboxed = box_sandboxed(row)
    warnings = [rules.box_dead(row.id)] if dead else []
    if not sandboxed:
        warnings.append(rules.UNSANDBOXED)
    return {"vm_id": row.id, "task_id": row.task_id, "name": row.name, "driver": row.driver,
            "state": rules.DEAD if dead else row.state,
            "sandbox": handle.get("sandbox"), "sandboxed": sandboxed, "network": handle.get("network"),
            "limits": handle.get("limits"), "warning": ". ".join(warnings) or None,
            "created_at": _iso(row.created_at), "destroyed_at": _iso(row.destroyed_at)}


EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_CURSOR = re.compile(r"(\d{1,17})\.(task_[0-9a-z]{1,40})")
BAD_CURSOR = ("bad page cursor {raw!r}: follow the Newer/Older links of the Boxes page, "
              "or open /boxes for the most recently active tasks")


def page_cursor(task: PageTask) -> str:
    """Return the cursor naming a task's place in the Boxes page order: `<last activity, µs since 1970>.<task id>`."""
    at = utc(task.last_activity_at) or EPOCH
    return f"{(at - EPOCH) // timedelta(microseconds=1)}.{task.id}"


def parse_page_cursor(raw: str | None) -> tuple[datetime, str] | None:
    """Read a page cursor (None when absent), or raise the refusal that says how to page instead."""
    if raw is None:
        return None
    m = _CURSOR.fullmatch(raw)
    if m is None:
        raise Invalid(BAD_CURSOR.format(raw=raw[:80]))
    return EPOCH + timedelta(microseconds=int(m.group(1))), m.group(2)


@dataclass(frozen=True, kw_only=True)
class BoxesPage:
    """One page of the Boxes page: tasks, their boxes, the totals, and the cursors of the pages beside it."""

    tasks: list[PageTask]
    boxes: list[PageBox]
    open_tasks: int     # on every page
    unsandboxed: bool   # a box on this page is unsandboxed, or new boxes would be (the driver in use)
    newer: str | None   # `before` cursor of the page of more recently active tasks, None on the first page
    older: str | None   # `after` cursor of the next page, None on the last
    first: bool         # this page starts at the most recently active task


class LeaseService:
    """Hold lease tasks for callers and run their boxes through one box driver."""

    def __init__(self, db: Database, clock: Clock, settings: LeaseSettings, driver: BoxDriver,
                 boxes: BoxSettings | None = None) -> None:
        self.db = db
        self.clock = clock
        self.settings = settings
        self.driver = driver
        self.boxes = boxes or BoxSettings()
        self.store: LeaseStore = SqlLeaseStore(db)
        if not getattr(driver, "sandboxed", True):
            log.warning("boxes are NOT sandboxed (boxes.driver = %r): a box's commands run as plain processes of "
                        "this machine and can read the hub's files; set boxes.driver = \"local\" to sandbox them",
                        driver.name)

    # --- the lease gate ------------------------------------------------------------------------

    async def _gate(self, conn: Connection, caller: Caller, raw: str | None, *, lock: bool) -> LeaseTask:
        """Return the task row a handle holds, or raise the refusal that names the mending tool."""
        handle: rules.Handle = _parse(rules.parse_handle, raw)
        row = await self.store.task(conn, handle.task_id, lock=lock)
        return self._check(row, caller, handle)

    def _check(self, row: G | None, caller: Caller, handle: rules.Handle) -> G:
        """Apply the lease rules to a task row read for `handle`."""
        if row is None or row.owner_id != caller.principal_id:
            raise NotFound(rules.not_yours(handle.task_id))
        if row.status != "open":
            raise Conflict(rules.closed(row.id, row.closed_reason))
        if row.secret_hash is None:
            raise Conflict(rules.released(row.id))
        if not hmac.compare_digest(row.secret_hash, _hash(handle.secret)):
            raise Conflict(rules.held_by(row.holder_label or "another agent",
                                         utc(row.attached_at) or utc(row.created_at)))
        return row

    async def _touch(self, conn: Connection, row: LeaseGate, now: datetime) -> None:
        """Record activity under the current handle, at most once per granularity."""
        due = rules.activity_due(utc(row.last_activity_at), now, self.settings.activity_granularity_s)
        if due and row.secret_hash is not None:  # always held here: `_check` passed it
            await self.store.touch(conn, row.id, row.secret_hash, now)

    # --- lease tasks ---------------------------------------------------------------------------

    async def new(self, caller: Caller, name: str | None) -> dict[str, Any]:
        """Open a task held by the caller and return it with its handle (shown once).

        Refused past `leases.max_open_tasks_per_principal` open tasks (admin tokens are exempt), counted under the
        owner's row lock so concurrent opens on several replicas never pass it together.
        """
        try:
            clean = rules.clean_name(name, required=True, what="task")
        except ValueError as e:
            raise Invalid(str(e)) from e
        now, secret = self.clock.now(), secrets.token_urlsafe(24)
        task_id = short_id("task")
        limit = 0 if caller.admin else self.settings.max_open_tasks_per_principal
        async with self.db.write() as conn:
            if limit:
                await self.store.lock_owner(conn, caller.principal_id)
                count = await self.store.count_open_tasks(conn, caller.principal_id)
                if count >= limit:
                    raise TooMany(rules.too_many_open_tasks(count, limit))
            row = await self.store.open_task(conn, task_id=task_id, owner_id=caller.principal_id, name=clean,
                                             holder_label=holder_of(caller), holder_token_id=caller.token_id,
                                             secret_hash=_hash(secret), now=now)
        return {**task_view(row), "handle": rules.format_handle(task_id, secret)}

    async def list(self, caller: Caller) -> list[dict[str, Any]]:
        """Return the caller's open tasks and the most recently closed ones, with their live boxes."""
        async with self.db.read() as conn:
            open_rows = await self.store.open_tasks(conn, caller.principal_id)
            closed_rows = await self.store.recently_closed(conn, caller.principal_id, RECENT_CLOSED)
            box_rows = await self.store.live_boxes_of_open_tasks(conn, caller.principal_id)
        by_task: dict[str, list[str]] = {}
        for b in box_rows:
            by_task.setdefault(b.task_id, []).append(b.id)
        return [task_view(r, by_task.get(r.id, [])) for r in [*open_rows, *closed_rows]]

    async def attach(self, caller: Caller, task_id: str | None, takeover: bool = False) -> dict[str, Any]:
        """Mint a new secret for one of the caller's open tasks; the previous handle stops working.

        A released task, or one whose lease is quiet for `takeover_quiet_s`, is taken without asking;
        a lease active lately is taken only with `takeover`.
        """
        tid: str = _parse(rules.parse_task_id, task_id)
        now, secret = self.clock.now(), secrets.token_urlsafe(24)
        async with self.db.write() as conn:
            row = await self.store.task(conn, tid, lock=True)
            if row is None or row.owner_id != caller.principal_id:
                raise NotFound(rules.not_yours(tid))
            if row.status != "open":
                raise Conflict(rules.closed(row.id, row.closed_reason))
            held = row.secret_hash is not None
            last = utc(row.last_activity_at)
            if not takeover and not rules.may_attach_without_takeover(held, last, now, self.settings.takeover_quiet_s):
                raise Conflict(rules.attach_refused(row.id, row.holder_label or "another agent",
                                                    utc(row.attached_at) or last, last, now,
                                                    self.settings.takeover_quiet_s))
            new_row = await self.store.attach(conn, tid, secret_hash=_hash(secret), holder_label=holder_of(caller),
                                              holder_token_id=caller.token_id, now=now)
            box_ids = await self.store.live_box_ids(conn, tid)
        return {**task_view(new_row, box_ids), "handle": rules.format_handle(tid, secret),
                "previous_holder": row.holder_label if held else None, "took_over": held}

    async def release(self, caller: Caller, handle: str | None) -> dict[str, Any]:
        """Give up the lease: the handle stops working and anyone of the owner's agents may attach."""
        now = self.clock.now()
        async with self.db.write() as conn:
            row = await self._gate(conn, caller, handle, lock=True)
            new_row = await self.store.release(conn, row.id, now)
        return task_view(new_row)

    async def close(self, caller: Caller, handle: str | None) -> dict[str, Any]:
        """Close the task and destroy every box in it."""
        now = self.clock.now()
        async with self.db.write() as conn:
            row = await self._gate(conn, caller, handle, lock=True)
            await self.store.close(conn, row.id, now, f"closed by {holder_of(caller)}")
        destroyed = await self._destroy_boxes_of([row.id])
        async with self.db.read() as conn:
            new_row = await self.store.task(conn, row.id)
        return {**task_view(new_row), "destroyed": destroyed}

    # --- boxes ---------------------------------------------------------------------------------

    async def vm_new(self, caller: Caller, handle: str | None, name: str | None = None) -> dict[str, Any]:
        """Claim a new box inside the held task.

        Refused past `boxes.max_live_per_principal` live boxes across the owner's tasks (admin tokens are exempt;
        counted under the owner's row lock) and, when it is set, past `boxes.max_per_task` in the task.
        """
        try:
            clean = rules.clean_name(name, required=False, what="box")
        except ValueError as e:
            raise Invalid(str(e)) from e
        now = self.clock.now()
        box_id = short_id("vm", 10)
        async with self.db.write() as conn:
            row = await self._gate(conn, caller, handle, lock=True)
            await self._touch(conn, row, now)
            limit = 0 if caller.admin else self.boxes.max_live_per_principal
            if limit:
                await self.store.lock_owner(conn, caller.principal_id)
                mine = await self.store.count_owner_live_boxes(conn, caller.principal_id)
                if mine >= limit:
                    raise TooMany(rules.too_many_live_boxes(mine, limit))
            if self.boxes.max_per_task:
                count = await self.store.count_live_boxes(conn, row.id)
                if count >= self.boxes.max_per_task:
                    raise Conflict(rules.too_many_boxes(row.id, count))
            # The provisional handle is stored first, so a box a crash catches half-made is still destroyed.
            await self.store.add_box(conn, box_id=box_id, task_id=row.id, name=clean, driver=self.driver.name,
                                     provisional=self.driver.provisional(box_id), now=now)
        try:
            box_handle = await self.driver.create(box_id)
        except BaseException as e:
            await self._destroy_quietly(box_id, self.driver.provisional(box_id))
            async with self.db.write() as conn:
                await self.store.box_failed(conn, box_id, self.clock.now())
            if isinstance(e, BoxError):
                raise Invalid(f"box could not be created: {e}") from e
            raise
        async with self.db.write() as conn:
            claimed = await self.store.box_made(conn, box_id, box_handle)
            box = await self.store.box(conn, box_id)
        if not claimed:  # the task closed while the box was being made
            await self._destroy_quietly(box_id, box_handle)
            raise Conflict(rules.closed(row.id, "closed while the box was being made"))
        return box_view(box)

    async def vm_list(self, caller: Caller, handle: str | None) -> builtins.list[dict[str, Any]]:
        """Return the live boxes of the held task (the lease and its boxes in one query: this is the hot path)."""
        now = self.clock.now()
        h: rules.Handle = _parse(rules.parse_handle, handle)
        async with self.db.read() as conn:
            task, live = await self.store.task_with_live_boxes(conn, h.task_id)
        row = self._check(task, caller, h)
        if rules.activity_due(utc(row.last_activity_at), now, self.settings.activity_granularity_s):
            async with self.db.write() as conn:
                await self._touch(conn, row, now)
        return [box_view(b, dead=await self._dead(b.state, b.handle)) for b in live]

    async def _dead(self, state: str, handle: dict[str, Any] | None) -> bool:
        """Say whether a box stored as live no longer runs (its driver checks its init; unknown counts as running).

        A listing only reads: the box stays live until `rift_vm_destroy`, closing its task, or the reaper."""
        if state != "live" or not handle:
            return False
        try:
            return await self.driver.alive(handle) is False
        except BoxError:
            return False

    async def _held_box(self, caller: Caller, raw: str | None, vm_id: str | None) -> tuple[LeaseTask, Box]:
        """Check a handle and find one live box of its task in one query, record the activity; return both.

        The lease refusals come first, then a malformed or unknown box.
        """
        now = self.clock.now()
        handle: rules.Handle = _parse(rules.parse_handle, raw)
        try:
            bid: str | None = rules.parse_box_id(vm_id)
        except rules.HandleError as e:
            bad_box, bid = Invalid(str(e)), None
        async with self.db.read() as conn:
            task, box = await self.store.task_with_box(conn, handle.task_id, bid or "")
        row = self._check(task, caller, handle)
        if rules.activity_due(utc(row.last_activity_at), now, self.settings.activity_granularity_s):
            async with self.db.write() as conn:  # a call under a live handle is activity, whatever its box
                await self._touch(conn, row, now)
        if bid is None:
            raise bad_box
        if box is None or box.state != "live":
            raise NotFound(rules.box_not_in_task(bid, row.id))
        return row, box

    async def vm_exec(self, caller: Caller, handle: str | None, vm_id: str | None, command: str | None,
                      timeout_s: float | None = None) -> dict[str, Any]:
        """Run a shell command in one of the task's boxes; output is capped and the exit code returned."""
        row, box = await self._held_box(caller, handle, vm_id)
        if not isinstance(command, str) or not command.strip():
            raise Invalid("command is empty; pass a shell command, e.g. command=\"ls -la\"")
        if len(command.encode()) > MAX_COMMAND_BYTES or "\0" in command:
            raise Invalid(f"command must be at most {MAX_COMMAND_BYTES} bytes without NUL; write long scripts "
                          f"to a file in the box first")
        timeout = DEFAULT_EXEC_TIMEOUT_S if timeout_s is None else timeout_s
        if not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_EXEC_TIMEOUT_S:
            raise Invalid(f"timeout_s must be between 0 and {MAX_EXEC_TIMEOUT_S:g} seconds; run longer work in the "
                          f"background (`nohup … > log 2>&1 &`) and poll it")
        try:
            res = await self.driver.exec(box.handle or {}, command, float(timeout))
        except BoxError as e:
            raise Conflict(str(e)) from e
        return {"vm_id": box.id, "task_id": row.id, "exit_code": res.exit_code, "stdout": res.stdout,
                "stderr": res.stderr, "stdout_truncated": res.stdout_truncated,
                "stderr_truncated": res.stderr_truncated,
                "timed_out": res.timed_out, "duration_s": res.duration_s}

    async def vm_destroy(self, caller: Caller, handle: str | None, vm_id: str | None) -> dict[str, Any]:
        """Destroy one box of the held task (kills its processes, removes it)."""
        _row, box = await self._held_box(caller, handle, vm_id)
        try:
            await self.driver.destroy(box.handle or {})
        except BoxError as e:
            raise Conflict(str(e)) from e
        await self._mark_destroyed(box.id)
        async with self.db.read() as conn:
            return box_view(await self.store.box(conn, box.id))

    async def _mark_destroyed(self, box_id: str) -> bool:
        async with self.db.write() as conn:
            return await self.store.mark_destroyed(conn, box_id, self.clock.now())

    async def _destroy_quietly(self, box_id: str, handle: dict[str, Any] | None) -> bool:
        """Destroy a box through the driver; on failure keep it for the reaper's next sweep."""
        try:
            if handle:
                await self.driver.destroy(handle)
        except BoxError as e:
            log.warning("box %s not destroyed here (%s); the reaper will retry", box_id, e)
            return False
        except Exception:  # one stubborn box must not stop the others; the sweep retries
            log.exception("destroying box %s failed; the reaper will retry", box_id)
            return False
        return True

    async def _destroy_boxes_of(self, task_ids: builtins.list[str]) -> builtins.list[str]:
        """Destroy the live boxes of closed tasks; return the ids marked destroyed."""
        async with self.db.read() as conn:
            rows = await self.store.live_boxes_of(conn, task_ids)
        return await self._destroy_rows(rows)

    async def _destroy_rows(self, rows: builtins.list[Box]) -> builtins.list[str]:
        """Destroy boxes through the driver, whatever their state, and mark the ones destroyed.

        A box still being made holds its provisional handle: destroying it removes what its maker made so
        far, and marking it makes the maker destroy the rest when it finishes.
        """
        done = []
        for b in rows:
            if await self._destroy_quietly(b.id, b.handle or self.driver.provisional(b.id)):
                if await self._mark_destroyed(b.id):
                    done.append(b.id)
        return done

    async def recover_stuck(self) -> builtins.list[str]:
        """Destroy boxes left `creating` by a crashed hub (older than the grace a live maker needs)."""
        cutoff = rules.stuck_cutoff(self.clock.now())
        async with self.db.read() as conn:
            rows = await self.store.stuck_boxes(conn, cutoff, REAP_BATCH)
        return await self._destroy_rows(rows)

    # --- reaper --------------------------------------------------------------------------------

    async def reap_once(self) -> dict[str, int]:
        """Close tasks quiet for `auto_close_quiet_s` and destroy the boxes of every closed task.

        Safe with several replicas: a task is closed by one conditional UPDATE (rows claimed with
        SKIP LOCKED on PostgreSQL), and destroying a box is idempotent, so two sweeps of one box are harmless.
        """
        now = self.clock.now()
        cutoff = rules.auto_close_cutoff(now, self.settings.auto_close_quiet_s)
        reason = f"quiet for {duration_text(self.settings.auto_close_quiet_s)}"
        async with self.db.write() as conn:
            closed = await self.store.close_quiet(conn, cutoff, now, reason, REAP_BATCH)
        async with self.db.read() as conn:
            leftover = await self.store.closed_tasks_with_live_boxes(conn, REAP_BATCH)
        destroyed = await self._destroy_boxes_of(leftover) if leftover else []
        stuck = await self.recover_stuck()
        return {"closed": closed, "destroyed": len(destroyed) + len(stuck)}

    async def reaper_step(self) -> None:
        """Reap once: the supervisor runs it at start (boxes a crash left behind) and then every 30 real seconds
        (the rules compare against the injected clock)."""
        await self.reap_once()

    # --- the Boxes page ------------------------------------------------------------------------

    async def boxes_page(self, principal_id: str, size: int, *, after: str | None = None,
                         before: str | None = None) -> BoxesPage:
        """Return one page of a user's open tasks (most recently active first) with their live boxes: one query.

        `after` / `before` are cursors of the page's neighbours (`BoxesPage.older` / `.newer`); a bad one is refused.
        """
        if after is not None and before is not None:
            raise Invalid("pass either `after` or `before`, not both: follow one of the Boxes page's links")
        after_key, before_key = parse_page_cursor(after), parse_page_cursor(before)
        async with self.db.read() as conn:
            page = await self.store.open_tasks_page(conn, principal_id, size, after=after_key, before=before_key)
        tasks = page.tasks
        if before_key is not None:  # read upwards: newer pages remain when there was more; the older one we came from
            newer = page_cursor(tasks[0]) if page.more and tasks else None
            older = page_cursor(tasks[-1]) if tasks else None
            first = not page.more
        else:
            newer = page_cursor(tasks[0]) if after_key is not None and tasks else None
            older = page_cursor(tasks[-1]) if page.more and tasks else None
            first = after_key is None
        unsandboxed = (not getattr(self.driver, "sandboxed", True)
                       or any(b.driver == "unsandboxed" for b in page.boxes))
        shown = [b._replace(state=rules.DEAD) if await self._dead(b.state, b.handle) else b for b in page.boxes]
        return BoxesPage(tasks=tasks, boxes=shown, open_tasks=page.open_tasks, unsandboxed=unsandboxed,
                         newer=newer, older=older, first=first)

