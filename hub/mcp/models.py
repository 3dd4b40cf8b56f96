"""Typed tool results; the MCP SDK generates output schemas from these."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ProfileInfo(BaseModel):
    """One profile a task can name."""

    name: str
    engine: str
    kind: str
    description: str
    digest: str


class ProfileList(BaseModel):
    """Profiles available to tasks."""

    profiles: list[ProfileInfo]


class Submitted(BaseModel):
    """An admitted task."""

    task_id: str
    status: str


class TaskResult(BaseModel):
    """A finished task's result."""

    text: str = ""
    json_: Any = Field(default=None, alias="json", serialization_alias="json")

    model_config = {"populate_by_name": True}


class ChangedFiles(BaseModel):
    """Paths created, modified and deleted in the run's workspace."""

    created: list[str] = []
    modified: list[str] = []
    deleted: list[str] = []


class TaskView(BaseModel):
    """A task's state, outcome and evidence."""

    task_id: str
    name: str | None = None
    status: str
    outcome: str | None = None
    result: TaskResult | None = None
    usage: dict[str, int] | None = None
    changed_files: ChangedFiles = ChangedFiles()
    error: str | None = None
    waiting_for: str | None = None  # while queued: why (e.g. "waiting for runtime gpu-box, offline since …")
    runtime: str | None = None
    snapshot: dict[str, Any] = {}
    parent_session_id: str | None = Field(None, description="the Session whose agent delegated this task")
    parent_turn_id: str | None = Field(None, description="the Turn of that Session that was active when it did")
    instance_id: str | None = Field(None, description="the Agent Instance this task is a run of")
    schedule_id: str | None = Field(None, description="the schedule whose firing created this task")
    firing_id: str | None = Field(None, description="that firing (see schedule_history)")
    created_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    timeline_page: str | None = Field(None, description=(
        "the Agent Timeline page of this task on the hub (raw tool input and output; task_timeline reads the same)"))


class TaskEvent(BaseModel):
    """One event of a task's log: `text` {text}, `tool` {tool: id/name/title/status}, `usage` {usage},
    `question` {text, options}, `permission` {request_id, tool, title}, `permission_answer` {request_id, allow}."""

    model_config = {"extra": "allow"}

    seq: int
    type: str
    at: str | None = None


class TimelinePage(BaseModel):
    """A run's Agent Timeline after a cursor: raw agent events (tool input and output, diffs, locations, text)."""

    task_id: str | None = None
    turn_id: str | None = None
    status: str
    outcome: str | None = None
    events: list[dict[str, Any]]
    cursor: int
    done: bool
    retention_s: float


class EventPage(BaseModel):
    """Events after a cursor, and the cursor to pass next."""

    task_id: str
    status: str
    outcome: str | None = None
    events: list[TaskEvent]
    cursor: int
    done: bool
    timed_out: bool = False


class PermissionAnswered(BaseModel):
    """A recorded answer to a permission request."""

    task_id: str
    request_id: str
    allow: bool
    status: str


class Cancelled(BaseModel):
    """The answer to a cancel request."""

    task_id: str
    status: str
    outcome: str | None = None
    note: str | None = None
