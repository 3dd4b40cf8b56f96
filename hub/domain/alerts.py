"""Alert rules: pure functions of (state, event, now) with the numbers passed in (config `alerts.*`, `feishu.*`).

Incident life: a failure, missed run or unknown outcome opens a *pending* incident; its first card waits
`aggregation_s` (unknown: `unknown_wait_s`) and carries what was seen meanwhile → *open* → later trouble
updates the card in place → a success starts *recovering* → `recovery_stable_s` without trouble → *closed*.
An unknown-only incident that sees a definite outcome before its wait ends is *withdrawn* (no notice).
Outbox gate: new messages (card, reminder, receipt, digest) respect quiet hours and the per-recipient rate
limit; in-place updates do not ping and pass both.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from hub.domain.states import DeliveryState, IncidentState, NoticeState

CHAT_KINDS = frozenset({"chat_card", "chat_update", "chat_part"})  # a chat's outputs: to the person who asked
NEW_KINDS = frozenset({"card", "reminder", "receipt", "digest"})  # ping the recipient: quiet hours + rate limit
UPDATE_KINDS = frozenset({"update"})                               # in place (PATCH): allowed any time
ACTIVE = frozenset({IncidentState.PENDING, IncidentState.OPEN, IncidentState.RECOVERING})
CARDED = frozenset({IncidentState.OPEN, IncidentState.RECOVERING})  # active with its card out
TROUBLE = {"failed": "failure", "timed_out": "failure", "missed": "missed", "unknown": "unknown"}

# Decision codes: why an outcome did or did not produce a notice (the decision log's vocabulary).
DECISIONS = {
    "overlap_skipped": "the previous run was still unfinished (overlap = skip): admission, not an outcome",
    "no_creator": "the schedule has no attributable creator: no proactive notice",
    "no_app": "no Feishu application is attributable to the schedule (creator has no single active binding)",
    "quiet_success": "recurring success is quiet",
    "muted": "the creator turned this schedule's notifications off (notify = none)",
    "receipt_all": "the creator asked for every outcome (notify = all): a receipt is queued",
    "quiet_cancelled": "a cancelled run is not trouble",
    "receipt": "one-shot terminal outcome: a receipt is queued",
    "aggregated": "trouble is aggregated before the first notice",
    "waiting_unknown": "an unknown outcome waits before alerting",
    "withdrawn": "the unknown outcome was followed by a definite one before its wait ended: no notice",
    "recovering": "success after trouble: recovering (the card closes after the stable period)",
    "updated": "ongoing incident: its card is updated in place",
    "opened": "aggregation ended: the incident's card is queued",
    "closed": "stable recovery: the card is closed",
    "reminder": "unacknowledged ongoing incident: one reminder a day",
    "acknowledged": "acknowledged: no more reminders",
    "snoozed": "snoozed: no reminders until the snooze ends",
    "unsnoozed": "snooze lifted: reminders resume",
    "quiet_hours": "quiet hours: deferred (never dropped)",
    "rate_limited": "rate limit reached: folded into the next digest",
    "suspended": "delivery to this application is suspended until `amux feishu recheck`",
    "missing_admin": "the application has no configured administrator: kept pending",
    "retired": "the administrator changed: the old request is retired",
    "superseded": "a newer update of the same card replaces this one",
    "sent": "delivered",
    "unconfirmed": "retries ran past Feishu's dedup window: delivery unconfirmed (not retried, never duplicated)",
    "dead": "permanent delivery error",
    "retry": "transient delivery error: retried with the same request uuid",
    "paused": "the schedule was paused from the alert center",
}


@dataclass(frozen=True, kw_only=True)
class Numbers:
    """The rule numbers (built from `AlertSettings` + `FeishuSettings.dedup_window_s`)."""

    aggregation_s: float = 60
    unknown_wait_s: float = 300
    reminder_interval_s: float = 86400
    recovery_stable_s: float = 600
    snooze_s: float = 86400
    quiet_hours: str = "22:00-08:00"
    max_new_messages: int = 3
    rate_window_s: float = 1800
    card_update_max_age_s: float = 14 * 86400
    dedup_window_s: float = 3600
    retry_base_s: float = 2
    retry_max_s: float = 300

    @classmethod
    def of(cls, alerts: Any, dedup_window_s: float) -> "Numbers":
        """Take the numbers from settings objects."""
        keys = [k for k in cls.__dataclass_fields__ if k != "dedup_window_s"]
        return cls(dedup_window_s=dedup_window_s, **{k: getattr(alerts, k) for k in keys})


@dataclass(frozen=True, kw_only=True)
class Incident:
    """One schedule's ongoing trouble, as the rules see it."""

    state: IncidentState
    opened_at: datetime
    failures: int = 0
    missed: int = 0
    unknowns: int = 0
    notify_at: datetime | None = None
    notified_at: datetime | None = None
    recovering_since: datetime | None = None
    closed_at: datetime | None = None
    acked_at: datetime | None = None
    acked_by: str | None = None           # who acknowledged: a principal's name, or a Feishu open_id (card click)
    ack_comment: str | None = None        # what they said with it (optional)
    snoozed_until: datetime | None = None
    last_ping_at: datetime | None = None
    last_outcome: str | None = None


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """A reconciled firing outcome, as the rules see it."""

    outcome: str | None          # None: the dispatch was refused (see admission)
    admission: str | None = None
    one_shot: bool = False
    missed_count: int = 0        # missed runs this event adds (a collapsed row's growth)
    has_creator: bool = True
    has_app: bool = True
    notify: str = "failures"     # the creator's preference: failures | all | none


@dataclass(frozen=True)
class Step:
    """What a rule decided: the incident's new state (None: no incident), notices to queue, and why."""

    incident: Incident | None
    notices: tuple[str, ...]
    decision: str


def classify(o: Outcome) -> str:
    """Return success | failure | missed | unknown | cancelled; a refused dispatch is a failure (`on_outcome` sets
    an overlap skip apart first: it is not refused, the previous run is still going)."""
    if o.outcome is None:
        return "failure"
    if o.outcome == "succeeded":
        return "success"
    if o.outcome == "cancelled":
        return "cancelled"
    return TROUBLE.get(o.outcome, "unknown")


def _label(o: Outcome) -> str:
    return o.outcome or (o.admission or "refused")


def on_outcome(inc: Incident | None, o: Outcome, now: datetime, n: Numbers) -> Step:
    """Apply one outcome to the schedule's active incident (None when it has none)."""
    if o.outcome is None and o.admission == "skipped:overlap":  # neither a failure nor a missed run
        return Step(inc, (), "overlap_skipped")
    if not o.has_creator:
        return Step(inc, (), "no_creator")
    if not o.has_app:
        return Step(inc, (), "no_app")
    if o.notify == "none":
        return Step(inc, (), "muted")
    if o.one_shot:
        return Step(inc, ("receipt",), "receipt")
    kind = classify(o)
    active = inc is not None and inc.state in ACTIVE
    if kind == "cancelled":
        return Step(inc, ("receipt",) if o.notify == "all" else (),
                    "receipt_all" if o.notify == "all" else "quiet_cancelled")
    if kind == "success":
        if not active:
            return Step(inc, ("receipt",), "receipt_all") if o.notify == "all" else Step(inc, (), "quiet_success")
        assert inc is not None  # active implies an incident
        if inc.state == IncidentState.PENDING and inc.failures == 0 and inc.missed == 0:
            return Step(replace(inc, state=IncidentState.WITHDRAWN, closed_at=now, notify_at=None), (), "withdrawn")
        if inc.recovering_since is not None:
            return Step(inc, (), "recovering")
        state = IncidentState.PENDING if inc.state == IncidentState.PENDING else IncidentState.RECOVERING
        nxt = replace(inc, state=state, recovering_since=now, last_outcome=_label(o))
        return Step(nxt, () if state == IncidentState.PENDING else ("update",), "recovering")
    add = {"failures": int(kind == "failure"), "missed": max(1, o.missed_count) if kind == "missed" else 0,
           "unknowns": int(kind == "unknown")}
    wait = n.unknown_wait_s if kind == "unknown" else n.aggregation_s
    if not active:
        fresh = Incident(state=IncidentState.PENDING, opened_at=now, notify_at=now + timedelta(seconds=wait),
                         last_outcome=_label(o), failures=add["failures"], missed=add["missed"],
                         unknowns=add["unknowns"])
        return Step(fresh, (), "waiting_unknown" if kind == "unknown" else "aggregated")
    assert inc is not None  # active implies an incident
    counts = {k: getattr(inc, k) + v for k, v in add.items()}
    if inc.state == IncidentState.PENDING:
        due = min(inc.notify_at or now, now + timedelta(seconds=wait))
        nxt = replace(inc, notify_at=due, recovering_since=None, last_outcome=_label(o), **counts)
        return Step(nxt, (),
                    "waiting_unknown" if kind == "unknown" and nxt.failures + nxt.missed == 0 else "aggregated")
    nxt = replace(inc, state=IncidentState.OPEN, recovering_since=None, last_outcome=_label(o), **counts)
    return Step(nxt, ("update",), "updated")


def on_tick(inc: Incident, now: datetime, n: Numbers) -> Step | None:
    """Advance an active incident by time alone; None when nothing is due."""
    if inc.state == IncidentState.PENDING and inc.notify_at is not None and now >= inc.notify_at:
        state = IncidentState.RECOVERING if inc.recovering_since else IncidentState.OPEN
        return Step(replace(inc, state=state, notify_at=None, notified_at=now, last_ping_at=now), ("card",), "opened")
    if inc.state in CARDED and inc.recovering_since is not None \
            and now - inc.recovering_since >= timedelta(seconds=n.recovery_stable_s):
        return Step(replace(inc, state=IncidentState.CLOSED, closed_at=now), ("update",), "closed")
    if inc.state == IncidentState.OPEN and inc.acked_at is None and inc.last_ping_at is not None \
            and now - inc.last_ping_at >= timedelta(seconds=n.reminder_interval_s):
        if inc.snoozed_until is not None and now < inc.snoozed_until:
            return None
        return Step(replace(inc, last_ping_at=now), ("reminder",), "reminder")
    return None


def next_tick(inc: Incident, n: Numbers) -> datetime | None:
    """Return when `on_tick` may next have something to do (for the loop's sleep and the due-incident query)."""
    if inc.state == IncidentState.PENDING:
        return inc.notify_at
    if inc.state not in CARDED:
        return None
    times = []
    if inc.recovering_since is not None:
        times.append(inc.recovering_since + timedelta(seconds=n.recovery_stable_s))
    elif inc.acked_at is None and inc.last_ping_at is not None:
        t = inc.last_ping_at + timedelta(seconds=n.reminder_interval_s)
        times.append(max(t, inc.snoozed_until) if inc.snoozed_until else t)
    return min(times) if times else None


def acknowledge(inc: Incident, now: datetime, by: str | None = None, comment: str | None = None) -> Step:
    """Stop reminders for this incident (updates still arrive); remember who did it and what they said."""
    return Step(replace(inc, acked_at=now, acked_by=by, ack_comment=comment or None), ("update",), "acknowledged")


def snooze(inc: Incident, now: datetime, n: Numbers, seconds: float | None = None) -> Step:
    """Hold reminders for `seconds` (default `snooze_s`, the card button's 24 h)."""
    until = now + timedelta(seconds=n.snooze_s if seconds is None else seconds)
    return Step(replace(inc, snoozed_until=until), ("update",), "snoozed")


def unsnooze(inc: Incident, now: datetime) -> Step:
    """Lift a snooze: a reminder that fell due during it is sent at the next tick."""
    return Step(replace(inc, snoozed_until=None), ("update",), "unsnoozed")


def retarget(inc: Incident) -> Incident:
    """Clear what belonged to the old administrator (ack, snooze); execution state and counts stay."""
    return replace(inc, acked_at=None, acked_by=None, ack_comment=None, snoozed_until=None)


# ---------------------------------------------------------------- outbox gate

def _hm(text: str) -> time:
    h, m = text.strip().split(":")
    return time(int(h), int(m))


def quiet_until(now: datetime, tz: str, spec: str) -> datetime | None:
    """Return when quiet hours end if `now` falls inside them (local to `tz`), else None."""
    if not spec:
        return None
    start, end = (_hm(p) for p in spec.split("-"))
    zone = ZoneInfo(tz)
    local = now.astimezone(zone)
    t = local.time().replace(tzinfo=None)
    inside = (start <= t or t < end) if start > end else (start <= t < end)
    if not inside:
        return None
    day = local.date() if t < end else local.date() + timedelta(days=1)
    return datetime.combine(day, end, tzinfo=zone).astimezone(now.tzinfo)


@dataclass(frozen=True)
class AppState:
    """A Feishu application's delivery state, as the gate sees it."""

    admin_open_id: str | None
    delivery_state: str = DeliveryState.OK


@dataclass(frozen=True)
class Gate:
    """The gate's verdict on one due notice: send | defer | fold | hold | retire | supersede."""

    action: str
    decision: str
    until: datetime | None = None


def gate(kind: str, recipient: str | None, tz: str, app: AppState | None, slots: list[datetime],
         now: datetime, n: Numbers) -> Gate:
    """Decide whether a due notice may be sent now; `slots` are the send times of recent new messages.

    A chat output goes to the person who is waiting for it: no administrator, quiet hours or new-message budget
    applies (the channel paces calls within Feishu's limits); only an application the hub does not know holds it.
    """
    if kind in CHAT_KINDS:
        return Gate("send", "sent") if app is not None else Gate("hold", "missing_admin")
    if app is None or not app.admin_open_id:
        return Gate("hold", "missing_admin")
    if app.delivery_state == DeliveryState.SUSPENDED:
        return Gate("hold", "suspended")
    if recipient is not None and recipient != app.admin_open_id:
        return Gate("retire", "retired")
    if kind not in NEW_KINDS:
        return Gate("send", "sent")
    end = quiet_until(now, tz, n.quiet_hours)
    if end is not None:
        return Gate("defer", "quiet_hours", end)
    window = timedelta(seconds=n.rate_window_s)
    recent = sorted(s for s in slots if s > now - window)
    if len(recent) >= n.max_new_messages:
        free = recent[len(recent) - n.max_new_messages] + window
        return Gate("defer" if kind == "digest" else "fold", "rate_limited", free)
    return Gate("send", "sent")


def backoff_s(attempts: int, n: Numbers) -> float:
    """Exponential backoff before retry number `attempts` (1-based), capped."""
    from tenacity import wait_exponential

    class _State:  # tenacity's wait strategies read only the attempt number
        attempt_number = max(1, attempts)

    state: Any = _State()
    return float(wait_exponential(multiplier=n.retry_base_s, min=n.retry_base_s, max=n.retry_max_s)(state))


def after_failure(verdict: str, attempts: int, first_attempt_at: datetime, now: datetime,
                  retry_after_s: float | None, n: Numbers) -> tuple[str, datetime | None, str]:
    """Return (state, next_attempt_at, decision) after a failed attempt (`attempts` counts it)."""
    if verdict == "permanent":
        return NoticeState.DEAD, None, "dead"
    if verdict == "suspend":
        return NoticeState.PENDING, now, "suspended"
    nxt = now + timedelta(seconds=max(backoff_s(attempts, n), retry_after_s or 0))
    # A retry reuses the uuid; Feishu only deduplicates it for dedup_window_s after the first attempt.
    if nxt - first_attempt_at >= timedelta(seconds=n.dedup_window_s):
        return NoticeState.UNCONFIRMED, None, "unconfirmed"
    return NoticeState.PENDING, nxt, "retry"


def card_patchable(card_sent_at: datetime | None, now: datetime, n: Numbers) -> bool:
    """Return whether a card sent at `card_sent_at` may still be updated in place."""
    return card_sent_at is not None and now - card_sent_at < timedelta(seconds=n.card_update_max_age_s)


# ---------------------------------------------------------------- durations (`amux alerts snooze --for 4h`)

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> int:
    """Return the seconds of a duration such as `30m`, `4h`, `1d`, `1h30m` or `90` (seconds); ValueError if not."""
    s = text.strip().lower()
    if s.isdigit():
        total = int(s)
    else:
        total, num = 0, ""
        for ch in s:
            if ch.isdigit():
                num += ch
            elif ch in _UNITS and num:
                total, num = total + int(num) * _UNITS[ch], ""
            else:
                raise ValueError(f"{text!r} is not a duration: use a number and a unit, e.g. 30m, 4h, 1d or 1h30m")
        if num or not s:
            raise ValueError(f"{text!r} is not a duration: use a number and a unit, e.g. 30m, 4h, 1d or 1h30m")
    if total <= 0:
        raise ValueError(f"{text!r} is not a positive duration: e.g. 30m, 4h or 1d")
    return total
