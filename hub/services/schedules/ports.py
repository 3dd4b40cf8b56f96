"""The schedule feature's seams: Sessions (session-prompt delivery), Task cancellation (overlap = replace) and the
outcome feed (alerts)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from ...domain.tasks import Status
from ...store.db import Connection
from ...store.records import TaskRunRecord
from ..auth.service import Caller

OUTCOMES = ("succeeded", "failed", "cancelled", "timed_out", "missed", "unknown")


@dataclass(frozen=True, kw_only=True)
class FiringOutcome:
    """A firing's outcome was reconciled (or, for a refused dispatch, its admission was recorded).

    `outcome` is one of OUTCOMES; it is None only when the dispatch was refused (`admission` is then
    `skipped:offline`, `skipped:overlap` or `error:<reason>`), which is not an execution outcome. `creator_id` None
    means the schedule has no attributable creator: it gets no proactive notifications.
    """

    schedule_id: str
    firing_id: str
    nominal_time: datetime
    outcome: str | None
    admission: str | None
    creator_id: str | None
    app_id: str | None
    schedule_type: str
    one_shot: bool
    missed_count: int = 0
    task_id: str | None = None
    turn_id: str | None = None


class OutcomeSink(Protocol):
    """Where reconciled firing outcomes go (the alert pipeline implements this)."""

    async def publish(self, event: FiringOutcome) -> None:
        """Take one event; called after the outcome is committed, at most once per reconciliation.

        A collapsed missed row is published again each time its count grows (same firing_id). Raising
        loses this event (it is logged); an implementation that must not lose events writes its own outbox.
        """


class NullOutcomeSink:
    """Record nothing (until the alert pipeline is wired in)."""

    async def publish(self, event: FiringOutcome) -> None:
        """Drop the event."""


class RecordingOutcomeSink:
    """Keep every event in a list (tests, diagnostics)."""

    def __init__(self) -> None:
        self.events: list[FiringOutcome] = []

    async def publish(self, event: FiringOutcome) -> None:
        """Append the event."""
        self.events.append(event)


class SessionPort(Protocol):
    """What schedules need from Sessions."""

    async def resolve_ref(self, caller: Caller, ref: str) -> str:
        """Return the session id `ref` names for `caller`; raise AmuxError naming the fix for none/ambiguous."""

    async def submit_turn(self, caller: Caller, session_id: str, prompt: str, source: str = "schedule") -> str:
        """Submit `prompt` into the session (may wake its agent) and return the exact turn id; raise AmuxError on
        refusal."""

    async def turn_outcome(self, turn_id: str) -> str | None:
        """Return the turn's canonical terminal outcome (succeeded|failed|cancelled|timed_out), None while running."""


class TaskPort(Protocol):
    """What schedules need from Tasks: the cancellation a person's `task_cancel` uses (overlap = replace)."""

    async def cancel_in(self, conn: Connection, caller: Caller, task_id: str,
                        now: datetime) -> tuple[TaskRunRecord, Status | None]:
        """Cancel `caller`'s Task in the caller's transaction: at once when it has not started, else through its
        runner (which finishes it cancelled); a finished Task is left as it is (status None). Raise AmuxError when
        the Task is not the caller's."""

    def cancelled(self, row: TaskRunRecord) -> None:
        """Wake what a committed cancellation concerns (its waiters, its runner)."""
