"""The records the task, schedule, instance and session stores return: plain dataclasses, one per shape a query
reads, so a service never holds a database row (`hub/store/ports/` declares the stores' interfaces over them)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Mapping, TypeVar

R = TypeVar("R")


def record(cls: type[R], row: Mapping[Any, Any] | None) -> R | None:
    """Return `row` (a result's mapping) as a `cls`, reading only the columns `cls` declares, or None."""
    if row is None:
        return None
    return cls(**{f.name: row[f.name] for f in fields(cls) if f.name in row})  # type: ignore[arg-type]


def records(cls: type[R], rows: Any) -> list[R]:
    """Return every row of a result's mappings as a `cls`."""
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    return [cls(**{n: r[n] for n in names if n in r}) for r in rows]


@dataclass(frozen=True, kw_only=True)
class TaskRunRecord:
    """One run (a Task or a Session's Turn) with every column of `task_runs`."""

    id: str
    owner_id: str
    name: str | None
    prompt: str
    snapshot: dict[str, Any]
    status: str
    outcome: str | None
    error: str | None
    result_text: str | None
    result_json: Any
    usage_json: dict[str, int] | None
    changed_files: dict[str, list[str]] | None
    runtime_id: str | None
    attempt: int
    event_seq: int
    last_rseq: int
    cancel_requested_at: datetime | None
    deadline_at: datetime | None
    created_at: datetime
    dispatched_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    parent_session_id: str | None
    parent_turn_id: str | None
    instance_id: str | None
    kind: str
    session_id: str | None
    turn_seq: int | None
    resume_handle: str | None


@dataclass(frozen=True, kw_only=True)
class TaskLine:
    """A Task as the owner's list shows it."""

    id: str
    name: str | None
    status: str
    created_at: datetime


@dataclass(frozen=True, kw_only=True)
class TaskEventRecord:
    """One event of a run's log."""

    seq: int
    type: str
    payload: dict[str, Any]
    created_at: datetime | None


@dataclass(frozen=True, kw_only=True)
class FiringRef:
    """The schedule firing that admitted a Task."""

    id: str
    schedule_id: str


@dataclass(frozen=True, kw_only=True)
class ScheduleRecord:
    """One schedule definition with every column of `schedules` (and, from a listing, its creator's name)."""

    id: str
    creator_id: str | None
    creator_binding_id: str | None
    app_id: str | None
    provenance: dict[str, Any] | None
    type: str
    session_ref: str | None
    name: str
    prompt: str
    profile: str | None
    runtime: str | None
    model: str | None
    reasoning_effort: str | None
    extra_args: list[str] | None
    permission_policy: str | None
    credential_profile: str | None
    timeout_s: float | None
    rule: str
    timezone: str
    paused: bool
    notify: str
    overlap: str
    deleted_at: datetime | None
    next_fire_at: datetime | None
    created_at: datetime
    updated_at: datetime
    creator_name: str | None = None


@dataclass(frozen=True, kw_only=True)
class InstanceRecord:
    """One Agent Instance with every column of `instances`."""

    id: str
    owner_id: str
    name: str | None
    session_id: str
    snapshot: dict[str, Any]
    archived_at: datetime | None
    current_task_id: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class Mail:
    """One mailbox message waiting for the instance's next run."""

    id: str
    text: str


@dataclass(frozen=True)
class CurrentRun:
    """What an instance needs to know of its current run: its status and the runtime it is placed on."""

    status: str
    runtime_id: str | None


@dataclass(frozen=True)
class OwnerRun:
    """One unfinished owner TaskRun of an instance: queued, dispatched or running."""

    id: str
    status: str
    runtime_id: str | None


@dataclass(frozen=True, kw_only=True)
class SessionRecord:
    """One Session with every column of `sessions`."""

    id: str
    name: str | None
    owner_id: str
    kind: str
    source: str
    engine: str
    model: str | None
    reasoning_effort: str | None
    snapshot: dict[str, Any]
    runtime_id: str | None
    resume_handle: str | None
    parent_session_id: str | None
    turns: int
    memory_scope: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, kw_only=True)
class SessionLine:
    """A Session as its owner's list shows it: its columns but the snapshot, and its sticky runtime's name."""

    id: str
    name: str | None
    kind: str
    source: str
    engine: str
    model: str | None
    reasoning_effort: str | None
    turns: int
    resume_handle: str | None
    created_at: datetime
    updated_at: datetime
    runtime: str | None


@dataclass(frozen=True, kw_only=True)
class SessionRun:
    """One run of a Session as its recent runs show it."""

    id: str
    turn_seq: int
    kind: str
    status: str
    result_text: str | None
