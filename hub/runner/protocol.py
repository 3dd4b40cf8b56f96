"""Messages between hub and runner over `/runner/ws` (JSON objects with a `type`)."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

PROTOCOL_VERSION = 1

QUESTION_DIAGNOSTIC = (
    "The task asked the user a question, but task children have no channel to ask users; "
    "gather the missing input in an interactive session and submit a new task. / "
    "任务向用户提出了问题，但子任务无法向用户提问；请在交互式会话中收集缺少的信息，然后提交新任务。"
)


class RunningWork(BaseModel):
    """A task the runner holds (running, or finished with the report not yet acknowledged)."""

    task_id: str
    attempt: int


class Register(BaseModel):
    """Runner → hub, first message: who I am, what I can do, what I already hold."""

    type: Literal["register"] = "register"
    protocol: int = PROTOCOL_VERSION
    name: str = Field(min_length=1, max_length=200)
    slots: int = Field(ge=1, le=1024)
    capabilities: dict[str, Any]
    running: list[RunningWork] = []


class Registered(BaseModel):
    """Hub → runner: registration accepted."""

    type: Literal["registered"] = "registered"
    runtime_id: str
    heartbeat_s: float
    drop: list[str] = []  # tasks the hub no longer considers the runner's: stop them


class Dispatch(BaseModel):
    """Hub → runner: run this task (idempotent by task id and attempt)."""

    type: Literal["dispatch"] = "dispatch"
    task_id: str
    attempt: int
    prompt: str
    snapshot: dict[str, Any]
    env: dict[str, str] = {}  # credential values for this launch only: never stored, never echoed
    # A direct Session's Turn (a chat or CLI session, not a Task, scheduled subtask or instance run): a structured
    # question ends it `waiting_for_user` with the question, instead of failing it with the diagnostic.
    direct_session: bool = False
    # A linux-dac run: the uid its owner's children run under (allocated by the hub, one per principal).
    uid: int | None = None
    # The run's owner: a sandboxed (linux-dac, userns) run's persistent home is its principal's own.
    principal: str | None = None


class Cancel(BaseModel):
    """Hub → runner: cancel this attempt of this task (idempotent)."""

    type: Literal["cancel"] = "cancel"
    task_id: str
    # The attempt it acts on: a runner running another attempt of the task leaves that one alone. None (an older
    # hub): whichever attempt the runner holds.
    attempt: int | None = None


class PermissionAnswer(BaseModel):
    """Hub → runner: the caller's answer to a permission request of a running task (idempotent)."""

    type: Literal["permission"] = "permission"
    task_id: str
    request_id: str
    allow: bool
    message: str = ""
    attempt: int | None = None  # the attempt that asked (None: an older hub's answer, for the attempt held)


class Accepted(BaseModel):
    """Runner → hub: I launched the task; commit the reservation."""

    type: Literal["accepted"] = "accepted"
    task_id: str
    attempt: int


class Event(BaseModel):
    """One canonical event with the runner's per-attempt sequence number."""

    rseq: int
    type: str
    payload: dict[str, Any]


class Events(BaseModel):
    """Runner → hub: canonical events in order."""

    type: Literal["events"] = "events"
    task_id: str
    attempt: int
    events: list[Event]


class Question(BaseModel):
    """A structured question the agent asked the person: its text, the options offered, whether free text answers."""

    text: str = Field(max_length=20_000)
    options: list[str] = Field(default_factory=list, max_length=50)
    free_text: bool = True


Outcome = Literal["succeeded", "failed", "cancelled", "timed_out", "waiting_for_user"]


def _no_changes() -> dict[str, list[str]]:
    return {"created": [], "modified": [], "deleted": []}


class Finished(BaseModel):
    """Runner → hub: the terminal outcome and everything the TaskRun keeps."""

    type: Literal["finished"] = "finished"
    task_id: str
    attempt: int
    rseq: int
    outcome: Outcome
    result_text: str = ""
    result_json: Any = None
    error: str | None = None
    usage: dict[str, int] | None = None
    changed_files: dict[str, list[str]] = Field(default_factory=_no_changes)
    resume_handle: str | None = None
    question: Question | None = None  # with outcome `waiting_for_user`: what the agent asked


class Steer(BaseModel):
    """Hub → runner: a correction for the running turn of this task (idempotent by steer id)."""

    type: Literal["steer"] = "steer"
    task_id: str
    steer_id: str
    text: str
    attempt: int | None = None  # the attempt whose turn it is for (None: an older hub's, for the attempt held)


class Steered(BaseModel):
    """Runner → hub: whether the running turn took the correction."""

    type: Literal["steered"] = "steered"
    task_id: str
    steer_id: str
    delivered: bool
    reason: str | None = None  # not delivered: why (the engine takes no input mid-turn, the run ended, …)


class Ack(BaseModel):
    """Hub → runner: everything up to `rseq` of this attempt of the task is stored (or the attempt is not yours:
    `drop`). A runner applies it only to the attempt it names: a refusal of an earlier attempt must not stop the
    attempt the hub placed on it since (None, from an older hub, means the attempt the runner holds)."""

    type: Literal["ack"] = "ack"
    task_id: str
    rseq: int
    drop: bool = False
    attempt: int | None = None


class Heartbeat(BaseModel):
    """Runner → hub: still here."""

    type: Literal["heartbeat"] = "heartbeat"


class ErrorMsg(BaseModel):
    """Hub → runner: a refusal naming the fix."""

    type: Literal["error"] = "error"
    message: str
    code: str | None = None  # "token_revoked": the runner stops (reconnecting cannot help)


RUNNER_MESSAGES = {m.model_fields["type"].default: m for m in (Register, Accepted, Events, Finished, Steered,
                                                               Heartbeat)}
HUB_MESSAGES = {m.model_fields["type"].default: m for m in (Registered, Dispatch, Cancel, PermissionAnswer, Steer, Ack,
                                                            ErrorMsg)}
