"""The typed views services answer with: one definition each, served as they are by REST (the JSON body, and the
OpenAPI document's answer schema), by MCP (structured content and the tool's output schema) and read by the bot's
cards. Field names and types are the wire format; `wire()` is the JSON object both doors send."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class View(BaseModel):
    """A service's answer: typed fields, serialized alike on every door."""

    model_config = ConfigDict(populate_by_name=True)

    def wire(self) -> dict[str, Any]:
        """Return the JSON object the doors send (aliases as field names)."""
        return self.model_dump(mode="json", by_alias=True)

    def __getitem__(self, key: str) -> Any:
        """Read a field by its wire name, as the JSON answer has it (`view["status"]`)."""
        for name, info in type(self).model_fields.items():
            if key in (name, info.alias):
                return getattr(self, name)
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        """Read a field by its wire name, or `default` when the view has no such field."""
        try:
            return self[key]
        except KeyError:
            return default


class TaskResult(View):
    """A finished task's result."""

    text: str = ""
    json_: Any = Field(default=None, alias="json", serialization_alias="json")


class ChangedFiles(View):
    """Paths created, modified and deleted in the run's workspace."""

    created: list[str] = []
    modified: list[str] = []
    deleted: list[str] = []


class TaskView(View):
    """A task's view: state, outcome, evidence and provenance (ids are null where they do not apply)."""

    task_id: str
    name: str | None
    status: str
    outcome: str | None
    result: TaskResult | None = Field(description="a terminal task's result (null until then)")
    usage: dict[str, int] | None
    changed_files: ChangedFiles
    error: str | None
    runtime: str | None
    snapshot: dict[str, Any]
    limits: dict[str, Any] | None = Field(
        default=None, description="the resource limits its child runs under on its runtime: the lower of the "
                                  "snapshot's `limits` (profile, request) and the runtime's; memory_max bytes, "
                                  "pids_max, cpu_max cores, and how each is enforced (`mechanism`); null before "
                                  "placement or with no child")
    parent_session_id: str | None = Field(description="the Session whose agent delegated this task")
    parent_turn_id: str | None = Field(description="the Turn of that Session that was active when it did")
    instance_id: str | None = Field(description="the Agent Instance this task is a run of")
    schedule_id: str | None = Field(description="the schedule whose firing created this task")
    firing_id: str | None = Field(description="that firing (schedule_history, `GET /api/v1/schedules/{id}/history`)")
    waiting_for: str | None = Field(description='while queued: why (e.g. "waiting for runtime gpu-box, offline '
                                                'since …")')
    created_at: str | None
    started_at: str | None
    finished_at: str | None
    timeline_page: str = Field(description="the task's Agent Timeline page on the hub (`/timeline/tasks/{id}`; raw "
                               "tool input and output); its data: `GET /api/v1/tasks/{id}/timeline`, MCP task_timeline")


class ScheduleNotifications(View):
    """Where this schedule's status notices go (the administrator of `app_id`), or why they do not."""

    notifies: bool
    app_id: str | None = None
    basis: str
    why: str


class ScheduleView(View):
    """A schedule with the runtime, model, policy and arguments saved as given (None: resolved at each fire)."""

    schedule_id: str
    name: str
    schedule_type: Literal["subtask", "session-prompt"]
    session_ref: str | None
    prompt: str
    rule: str
    timezone: str
    one_shot: bool
    paused: bool
    consumed: bool
    next_fire_at: str | None
    profile: str | None
    runtime: str | None
    model: str | None
    reasoning_effort: str | None
    extra_args: list[str] | None
    permission_policy: str | None
    credential_profile: str | None
    timeout_s: float | None
    notify: Literal["failures", "all", "none"]
    overlap: Literal["allow", "skip", "replace"]
    creator: str | None
    creator_id: str | None
    app_id: str | None
    created_at: str | None
    updated_at: str | None
    notifications: ScheduleNotifications | None = Field(
        default=None, description="schedule_get, schedule_create and the other single-schedule answers only")


def _absent(value: Any) -> bool:
    return value is None


class InstanceView(View):
    """An Agent Instance: status active/idle/archived, kept apart from Session state and TaskRun status."""

    instance_id: str
    name: str | None
    status: Literal["active", "idle", "archived"] = Field(description="active while any owner TaskRun is unfinished")
    session_id: str = Field(description="the child Session its runs share")
    profile: str
    engine: str
    model: str | None
    permission_policy: str | None
    runtime: str | None = Field(description="the sticky runtime's name (null until placed, or when it is gone)")
    workspace_ref: str
    home_ref: str
    resume_handle: str | None
    current_task_id: str | None
    current_task_status: str | None
    unfinished_task_ids: list[str] = Field(description=(
        "every owner TaskRun not yet terminal, oldest first; the instance is active while there is one"))
    mailbox_queued: int
    created_at: str | None


class InstanceCreatedView(InstanceView):
    """A new Agent Instance, with its first run when `prompt` started one."""

    task_id: str | None = Field(default=None, exclude_if=_absent, description="the first run (present with `prompt`)")


class InstanceWaitView(InstanceView):
    """An Agent Instance after waiting for its current run (`task` and `timed_out` absent when it has none)."""

    task: TaskView | None = Field(default=None, exclude_if=_absent, description="the current run as task_get shows it")
    timed_out: bool | None = Field(default=None, exclude_if=_absent,
                                   description="the wait ended before the run was terminal (the run goes on)")


class InstanceListView(View):
    """The caller's Agent Instances, newest first."""

    instances: list[InstanceView]


class FollowupView(View):
    """A followup admitted as a new owner TaskRun."""

    instance_id: str
    task_id: str
    status: str
    mailbox_delivered: int = Field(description="queued mailbox messages that went ahead of the prompt")


class MailView(View):
    """Mailbox input queued for the instance's next run."""

    instance_id: str
    message_id: str
    state: Literal["queued"]


class SteerView(View):
    """Where a correction went: taken by the running turn, queued in the mailbox, or unknown (not queued)."""

    instance_id: str
    delivery: Literal["delivered", "queued", "unknown"] = Field(description=(
        "delivered: the running turn took it; queued: no turn could take it (idle, not started, or the engine "
        "takes no steering), so it goes ahead of the next prompt; unknown: the runner never confirmed — not queued"))
    message_id: str
    note: str
    reason: str | None = Field(default=None, description=(
        "queued: why no turn took it (e.g. the engine's protocol takes no input mid-turn, the turn had ended)"))


class CancelledRun(View):
    """One owner TaskRun an interrupt cancelled, and its status after."""

    task_id: str
    status: str


class InterruptView(View):
    """What an interrupt cancelled: the oldest unfinished run's status, and every run it reached."""

    instance_id: str
    task_id: str
    task_status: str
    cancelled: list[CancelledRun]
