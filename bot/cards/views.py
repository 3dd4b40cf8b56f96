"""View models of the bot's cards: plain data the handlers fill and the renderers read."""
from __future__ import annotations

from dataclasses import dataclass, field

from hub.domain.states import DeliveryState


@dataclass(frozen=True)
class Outcome:
    """One firing as the user sees it."""

    schedule_name: str
    nominal_time: str | None
    state: str          # succeeded / failed / cancelled / timed_out / missed / unknown / pending / skipped / error
    firing_id: str = ""


@dataclass(frozen=True, kw_only=True)
class OverviewView:
    """The `/amux` overview: a personal summary and the schedule entries."""

    viewer: str
    total: int
    failing: int
    paused: int
    latest: tuple[Outcome, ...] = ()
    is_admin: bool = False
    active_incidents: int = 0
    timezone: str = "Asia/Shanghai"   # the viewer's application's: the times shown


@dataclass(frozen=True, kw_only=True)
class ScheduleItem:
    """One row of the personal schedule list."""

    schedule_id: str
    name: str
    rule: str
    paused: bool
    next_fire_at: str | None
    last: str | None = None   # last outcome state
    timezone: str = "UTC"     # the schedule's: its next run is shown in it


@dataclass(frozen=True)
class ScheduleListView:
    """A page of the viewer's own schedules."""

    items: tuple[ScheduleItem, ...]
    page: int
    pages: int
    total: int


@dataclass(frozen=True, kw_only=True)
class ScheduleDetailView:
    """One schedule: rule, next fire, recent outcomes and its controls."""

    schedule_id: str
    name: str
    rule: str
    timezone: str
    schedule_type: str
    paused: bool
    next_fire_at: str | None
    recent: tuple[Outcome, ...] = ()
    notice: str | None = None   # msgid shown above the controls (e.g. after an action)
    notify: str = "failures"    # the creator's notification preference: failures | all | none
    overlap: str = "allow"      # a fire while the previous Task is unfinished: allow | skip | replace


@dataclass(frozen=True, kw_only=True)
class HistoryView:
    """A page of one schedule's firings."""

    schedule_id: str
    name: str
    firings: tuple[Outcome, ...]
    page: int
    has_more: bool
    timezone: str = "UTC"      # the schedule's: the times shown


@dataclass(frozen=True, kw_only=True)
class ResultsView:
    """One part of one firing's Task result."""

    schedule_id: str
    name: str
    page: int          # which firing with a Task (0 = newest)
    pages: int         # how many firings have a Task
    part: int          # which part of the result text
    parts: int
    firing: Outcome | None = None
    text: str = ""
    timezone: str = "UTC"      # the schedule's: the times shown
    error: str = ""    # the hub's error of an unsuccessful Task, as it gave it (raw: the card escapes it)
    task_id: str = ""  # the firing's Task: the card links its Agent Timeline


@dataclass(frozen=True, kw_only=True)
class IncidentItem:
    """An incident as the administrator sees it (names and status, never prompts or results)."""

    incident_id: str
    schedule_name: str
    creator: str | None
    state: str
    failures: int
    missed: int
    unknowns: int
    last_outcome: str | None
    acknowledged: bool
    snoozed_until: str | None
    run_id: str = ""          # its last firing's Task or Turn: the card links its Agent Timeline
    run_kind: str = "task"    # task | turn


@dataclass(frozen=True, kw_only=True)
class Diagnostic:
    """One thing that blocks or clouds delivery, as facts the card words from the catalog (never the hub's English):
    the application's delivery state (`notice_kind` empty), or one notice that ended unconfirmed or dead."""

    state: str                 # unconfigured | suspended (the application) · unconfirmed | dead (a notice)
    notice_kind: str = ""      # incident | update | reminder | receipt | digest (a notice's kind)
    code: str = ""             # Feishu's error code, when there is one


@dataclass(frozen=True, kw_only=True)
class AlertCenterView:
    """The administrator alert center of one application."""

    app_id: str
    incidents: tuple[IncidentItem, ...]
    page: int
    pages: int
    delivery_state: str = DeliveryState.OK
    diagnostics: tuple[Diagnostic, ...] = field(default_factory=tuple)
    timezone: str = "Asia/Shanghai"   # the application's: the times shown
    snooze_s: float = 86400.0         # `alerts.snooze_s`: the Snooze button's length
