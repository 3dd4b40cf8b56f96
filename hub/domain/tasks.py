"""TaskRun states and the transitions between them."""
from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """Where a TaskRun is; the last five are terminal and equal the outcome."""

    QUEUED = "queued"          # admitted, waiting for capacity
    DISPATCHED = "dispatched"  # capacity reserved on a runtime, runner not yet confirmed
    RUNNING = "running"        # runner committed the reservation and launched the engine
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    WAITING_FOR_USER = "waiting_for_user"  # a direct Session's Turn ended on a question; the answer is the next Turn


TERMINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELLED, Status.TIMED_OUT, Status.WAITING_FOR_USER})
ACTIVE = frozenset({Status.QUEUED, Status.DISPATCHED, Status.RUNNING})
# The execution outcomes schedules and Task history reconcile; a Turn waiting for the person is not one of them.
OUTCOMES = tuple(s.value for s in (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED, Status.TIMED_OUT))

# A lost runtime's running work: accepted, so its engine may have run. Said as unknown, never as "didn't run".
RUNTIME_LOST = ("runtime lost while the task ran: its outcome is unknown (the engine may have finished, or may still "
                "be running on that machine); check the runtime and the task's workspace before you resubmit — if the "
                "runner comes back and reports, this record is corrected to what happened")


def is_terminal(status: str) -> bool:
    """Return whether a status is a terminal outcome."""
    return status in TERMINAL
