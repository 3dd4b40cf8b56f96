"""Lease-task rules (seed: Rift tasks): handles, clocks and refusal texts; pure, `now` passed in."""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from .durations import duration_text

TASK_PREFIX = "task_"
BOX_PREFIX = "vm_"
MAX_HANDLE_CHARS = 200
MAX_NAME_CHARS = 200
_TASK_ID = re.compile(r"task_[0-9a-z]{1,40}")
_BOX_ID = re.compile(r"vm_[0-9a-z]{1,40}")
_SECRET = re.compile(r"[A-Za-z0-9_-]{1,128}")

# Every refusal names the tool that mends it (seed: "Refusals").
NO_HANDLE = ("no task handle: pass `task` as task_<id>.<secret>; `rift_task_new` opens one "
             "(or `rift_task_attach <id>` takes up one of yours from `rift_task_list`)")
MALFORMED = ("malformed task handle: expected task_<id>.<secret> exactly as `rift_task_new` or `rift_task_attach` "
             "returned it; `rift_task_new` opens one, `rift_task_list` shows your tasks")
MALFORMED_ID = ("malformed task id: expected task_<id> as shown by `rift_task_list`; "
                "`rift_task_new` opens a new one")
MALFORMED_BOX = "malformed box id: expected vm_<id> as shown by `rift_vm_list`"


@dataclass(frozen=True)
class Handle:
    """A parsed lease handle: the task id and the holder's secret."""

    task_id: str
    secret: str


class HandleError(ValueError):
    """A handle that cannot be parsed; `str()` is the refusal text."""


def parse_handle(raw: str | None) -> Handle:
    """Split `task_<id>.<secret>`, or raise HandleError naming the tool that mends it."""
    if raw is None or not raw.strip():
        raise HandleError(NO_HANDLE)
    raw = raw.strip()
    if len(raw) > MAX_HANDLE_CHARS or raw.count(".") != 1:
        raise HandleError(MALFORMED)
    task_id, secret = raw.split(".")
    if not _TASK_ID.fullmatch(task_id) or not _SECRET.fullmatch(secret):
        raise HandleError(MALFORMED)
    return Handle(task_id, secret)


def format_handle(task_id: str, secret: str) -> str:
    """Join a task id and a secret into the handle an agent carries."""
    return f"{task_id}.{secret}"


def parse_task_id(raw: str | None) -> str:
    """Accept `task_<id>` (or a whole handle, whose secret is ignored) and return the id."""
    raw = (raw or "").strip()
    if len(raw) > MAX_HANDLE_CHARS:
        raise HandleError(MALFORMED_ID)
    task_id = raw.split(".", 1)[0]
    if not _TASK_ID.fullmatch(task_id):
        raise HandleError(MALFORMED_ID)
    return task_id


def parse_box_id(raw: str | None) -> str:
    """Return a well-formed `vm_<id>`, or raise HandleError."""
    raw = (raw or "").strip()
    if len(raw) > 60 or not _BOX_ID.fullmatch(raw):
        raise HandleError(MALFORMED_BOX)
    return raw


def clean_name(raw: str | None, *, required: bool, what: str) -> str | None:
    """Return a printable name of at most 200 characters, or raise ValueError naming the fix."""
    name = "".join(ch for ch in (raw or "") if ch.isprintable()).strip()
    if not name:
        if required:
            raise ValueError(f"{what} name is required: say what the work is, e.g. name=\"fix flaky login test\"")
        return None
    if len(name) > MAX_NAME_CHARS:
        raise ValueError(f"{what} name is longer than {MAX_NAME_CHARS} characters; shorten it")
    return name


# --- clocks -------------------------------------------------------------------------------------

def activity_due(last_activity: datetime | None, now: datetime, granularity_s: float) -> bool:
    """Say whether a call at `now` moves the stored activity time (at most once per granularity)."""
    return last_activity is None or now - last_activity >= timedelta(seconds=granularity_s)


def quiet_for(last_activity: datetime, now: datetime) -> timedelta:
    """Return how long a lease has been quiet."""
    return max(now - last_activity, timedelta(0))


def may_attach_without_takeover(held: bool, last_activity: datetime, now: datetime, takeover_quiet_s: float) -> bool:
    """Say whether attach succeeds without `takeover`: the task is released, or its lease is quiet long enough."""
    return not held or quiet_for(last_activity, now) >= timedelta(seconds=takeover_quiet_s)


def auto_close_due(last_activity: datetime, now: datetime, auto_close_quiet_s: float) -> bool:
    """Say whether a task quiet this long closes itself."""
    return quiet_for(last_activity, now) >= timedelta(seconds=auto_close_quiet_s)


def auto_close_cutoff(now: datetime, auto_close_quiet_s: float) -> datetime:
    """Return the last activity time at or before which a task is due to close itself."""
    return now - timedelta(seconds=auto_close_quiet_s)


# --- refusal texts ------------------------------------------------------------------------------

def when(dt: datetime) -> str:
    """Render a time for a refusal: ISO 8601 in UTC to the second."""
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def ago(dt: datetime, now: datetime) -> str:
    """Render how long ago `dt` was, for people ("just now", "3 min ago", "2 h 5 min ago")."""
    s = int(quiet_for(dt, now).total_seconds())
    if s < 60:  # the activity clock moves once a minute: seconds would claim a precision it does not have
        return "just now"
    return f"{duration_text(s // 60 * 60 if s < 86400 else s // 3600 * 3600)} ago"  # whole units passed


def not_yours(task_id: str) -> str:
    """Refuse a task that does not exist or belongs to someone else (the same words for both)."""
    return (f"task {task_id} does not exist or is not yours; `rift_task_list` shows your tasks, "
            "`rift_task_new` opens one")


def closed(task_id: str, reason: str | None) -> str:
    """Refuse a call on a closed task."""
    why = f" ({reason})" if reason else ""
    return f"task {task_id} is closed{why}; its VMs are gone; `rift_task_new` opens another"


def released(task_id: str) -> str:
    """Refuse a handle of a task whose lease was released."""
    return f"task {task_id} was released and has no holder; `rift_task_attach {task_id}` takes it up"


def held_by(holder: str, since: datetime) -> str:
    """Refuse a handle that is not the current lease (seed wording)."""
    return (f"held by {holder} since {when(since)}; `rift_task_attach` with takeover takes it over — tell the user")


def attach_refused(task_id: str, holder: str, since: datetime, last_activity: datetime, now: datetime,
                   takeover_quiet_s: float) -> str:
    """Refuse attach on a lease active lately (takeover not set)."""
    free_at = last_activity + timedelta(seconds=takeover_quiet_s)
    return (f"task {task_id} is held by {holder} since {when(since)}, active {ago(last_activity, now)}; "
            f"`rift_task_attach` with takeover=true takes it over — tell the user "
            f"(without takeover it can be taken up from {when(free_at)})")


def box_not_in_task(box_id: str, task_id: str) -> str:
    """Refuse a box that is not a live box of the task."""
    return f"box {box_id} is not a live box of task {task_id}; `rift_vm_list` shows its boxes, `rift_vm_new` makes one"


DEAD = "dead"  # how a listing shows a box whose init is gone (never stored: the row stays live until destroyed)


def box_dead(box_id: str) -> str:
    """Say a listed box no longer runs, and what mends it."""
    return (f"box {box_id} is no longer running (its processes were killed, e.g. `kill -9 -1` inside it, or the "
            f"machine restarted), so commands cannot run in it; `rift_vm_destroy` it and make another with "
            f"`rift_vm_new`")


UNSANDBOXED = ("NOT SANDBOXED: this hub runs boxes with boxes.driver = \"unsandboxed\"; a box's commands are plain "
               "processes of the hub's machine that can read the hub's files and reach its network. The operator "
               "sets boxes.driver = \"local\" (bubblewrap) to sandbox new boxes")
CREATING_GRACE_S = 120.0  # a box still `creating` this long after it was asked for was left by a crashed hub


def too_many_boxes(task_id: str, count: int) -> str:
    """Refuse one more box in a task that holds the configured most (`boxes.max_per_task`)."""
    return (f"task {task_id} already has {count} boxes, the most one task may hold on this hub (boxes.max_per_task); "
            f"`rift_vm_destroy` one, or `rift_task_new` for separate work")


def too_many_open_tasks(count: int, limit: int) -> str:
    """Refuse one more open task to a principal holding the configured most."""
    return (f"you already have {count} open lease tasks, the most one user may hold on this hub "
            f"(leases.max_open_tasks_per_principal = {limit}); close one you are done with with `rift_task_close` "
            f"(`rift_task_list` shows them; `rift_task_attach` takes one up to close it), or ask the operator to "
            f"raise the setting")


def too_many_live_boxes(count: int, limit: int) -> str:
    """Refuse one more box to a principal whose tasks hold the configured most live boxes."""
    return (f"you already have {count} live boxes across your tasks, the most one user may hold on this hub "
            f"(boxes.max_live_per_principal = {limit}); destroy one you are done with with `rift_vm_destroy` (or "
            f"close a task and its boxes with `rift_task_close`), or ask the operator to raise the setting")


def stuck_cutoff(now: datetime, grace_s: float = CREATING_GRACE_S) -> datetime:
    """Return the time before which a box still `creating` is taken to be abandoned by a crashed hub."""
    return now - timedelta(seconds=grace_s)
