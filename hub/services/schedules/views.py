"""What a Feishu operator's personal views show of schedules and firings (ScheduleService builds them; the bot
renders them as cards). Times are as the store returned them; the card decides how to print them."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

# What the overview counts as failing: a schedule whose latest firing shows one of these.
FAILING = ("failed", "timed_out", "missed", "error", "cancelled")
# The Task outcomes whose Results view names the outcome and the hub's error (a success shows its text only).
UNSUCCESSFUL = ("failed", "timed_out", "cancelled", "unknown")


def firing_state(outcome: str | None, admission: str | None) -> str:
    """Return what a firing shows: its reconciled outcome, else what admission said."""
    if outcome:
        return outcome
    adm = admission or ""
    if adm == "ok":
        return "pending"
    if adm.startswith("skipped"):
        return "skipped"
    if adm.startswith("error"):
        return "error"
    if adm == "missed":
        return "missed"
    return "unknown"


@dataclass(frozen=True, kw_only=True)
class FiringLine:
    """One firing as a personal view shows it."""

    firing_id: str
    schedule_id: str
    schedule_name: str
    nominal_time: datetime | None
    state: str


def firing_line(f: Any, schedule_name: str) -> FiringLine:
    """Return the line of one ledger row (any object with the firing's columns)."""
    return FiringLine(firing_id=f.id, schedule_id=f.schedule_id, schedule_name=schedule_name,
                      nominal_time=f.nominal_time, state=firing_state(f.outcome, f.admission))


@dataclass(frozen=True, kw_only=True)
class Summary:
    """The overview: how many schedules, how many fail or are paused, the latest outcomes."""

    total: int
    failing: int
    paused: int
    latest: tuple[FiringLine, ...]
    active_incidents: int = 0


@dataclass(frozen=True, kw_only=True)
class ScheduleLine:
    """One schedule in the personal list."""

    schedule_id: str
    name: str
    rule: str
    paused: bool
    next_fire_at: datetime | None
    last_state: str | None
    timezone: str = "UTC"


@dataclass(frozen=True, kw_only=True)
class SchedulePage:
    """One page of the personal list (`page` counts from 0 and is clamped to the last page)."""

    items: tuple[ScheduleLine, ...]
    page: int
    pages: int
    total: int


@dataclass(frozen=True, kw_only=True)
class ScheduleCard:
    """One schedule as its detail card and controls see it, with its most recent firings."""

    schedule_id: str
    name: str
    rule: str
    timezone: str
    schedule_type: str
    paused: bool
    next_fire_at: datetime | None
    notify: str
    deleted: bool
    recent: tuple[FiringLine, ...] = ()
    overlap: str = "allow"


@dataclass(frozen=True, kw_only=True)
class ResultPage:
    """One firing's Task result: which firing with a Task (`page`, 0 = newest) of how many, its text, and the
    error the hub recorded when the Task did not succeed."""

    schedule_id: str
    name: str
    page: int
    pages: int
    firing: FiringLine | None = None
    text: str = ""
    error: str = ""
    timezone: str = "UTC"
    task_id: str = ""  # the firing's Task (its Agent Timeline: /timeline/tasks/{task_id})


def failing(latest_first: list[Any]) -> int:
    """Count the schedules whose latest firing among `latest_first` (newest first) shows a failing state."""
    seen: set[str] = set()
    count = 0
    for f in latest_first:
        if f.schedule_id not in seen:
            seen.add(f.schedule_id)
            count += firing_state(f.outcome, f.admission) in FAILING
    return count
