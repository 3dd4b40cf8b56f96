"""Typed tool results; the MCP SDK generates output schemas from these (the views services return, such as
`TaskView`, are defined once in hub/services/views.py)."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from ..services.views import ChangedFiles, TaskResult, TaskView

__all__ = ["Cancelled", "ChangedFiles", "EventPage", "PermissionAnswered", "ProfileInfo", "ProfileList", "Submitted",
           "TaskEvent", "TaskResult", "TaskView"]


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
    attempt: int | None = Field(default=None, description="the attempt of the task that asked and gets the answer")


class Cancelled(BaseModel):
    """The answer to a cancel request."""

    task_id: str
    status: str
    outcome: str | None = None
    note: str | None = None
    attempt: int | None = Field(default=None, description="the attempt it acted on (null: none had started)")
