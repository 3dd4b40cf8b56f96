"""Schedule rules: parse the one `rule` string, compute fire times, decide what a due schedule does.

Pure: every function takes `now` (aware UTC) as an argument. APScheduler 3's trigger classes match the
fields; the hub's own durable loop does the firing.

DST (DESIGN §6): a local time that does not exist is skipped; a repeated local time fires once (the
first). APScheduler 3.11's CronTrigger with a zoneinfo timezone fires the non-existent time shifted
by an hour and fires a repeated time twice (for sub-hourly rules it even steps backwards through the
overlap), so cron fields are matched on the local wall clock (a UTC-labelled naive time) and each
wall time is mapped back to one real instant here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from ..errors import Invalid
from .durations import duration_text

EXAMPLES = ('cron (5 fields) "*/5 * * * *" or a macro "@daily", interval "every 30s" / "every 5m" / "every 2h", '
            'one-shot "at 2026-12-01T09:00:00+08:00"')
# Cron macros (crontab(5)), matched on the local wall clock of the schedule's timezone like any cron rule. Weekdays
# by name: APScheduler 3 numbers them from Monday = 0, crontab from Sunday = 0.
MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * sun",
          "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}
REBOOT = ("rule \"@reboot\" has no durable meaning here: the hub runs on several replicas that restart independently, "
          "and a schedule fires by the clock, not by a process start; use a time rule such as \"@daily\" or "
          "\"every 1h\", or an \"at <time>\" rule for a one-off")
_EVERY = re.compile(r"^every\s+(\d+)\s*([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_TICK = timedelta(microseconds=1)
MAX_WALK = 10_000  # fire times counted one by one when collapsing misses; beyond it the count is capped
SCAN_LIMIT = 1000  # wall-clock candidates examined for one next time (skipped DST times only)


def zone(name: str) -> ZoneInfo:
    """Return the IANA zone `name`, or refuse naming an example."""
    try:
        if not isinstance(name, str) or not name or name != name.strip():
            raise ValueError
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise Invalid(f"timezone {name!r} is not an IANA zone name; use e.g. \"UTC\", \"Asia/Shanghai\", "
                      "\"America/New_York\"") from e


@dataclass(frozen=True, kw_only=True)
class Rule:
    """A parsed rule: `kind` is cron | interval | at."""

    text: str
    kind: str
    tz: ZoneInfo
    cron: CronTrigger | None = None
    interval: timedelta | None = None
    at: datetime | None = None

    @property
    def one_shot(self) -> bool:
        """Whether the rule fires once and is then consumed."""
        return self.kind == "at"


MAX_INTERVAL_S = 3650 * 86400  # ten years: longer intervals are one-offs in disguise (and overflow datetimes)


def check_min_interval(rule: Rule, min_interval_s: float) -> None:
    """Refuse an interval rule shorter than `schedules.min_interval_s`, naming the setting."""
    if rule.kind == "interval" and rule.interval is not None and rule.interval.total_seconds() < min_interval_s:
        raise Invalid(f"rule {rule.text!r} fires more often than every {duration_text(min_interval_s)}, the shortest "
                      "this hub accepts (schedules.min_interval_s, env AMUX_SCHEDULES__MIN_INTERVAL_S); pick a longer "
                      "interval")


def parse(text: str, tz_name: str) -> Rule:
    """Parse a rule string in a timezone; a bad string is refused with an example of each form."""
    tz = zone(tz_name)
    if not isinstance(text, str) or not text.strip():
        raise Invalid(f"rule is empty; write one of: {EXAMPLES}")
    s = " ".join(text.strip().split())
    low = s.lower()
    if low.startswith("every"):
        m = _EVERY.match(low)
        if not m or int(m.group(1)) <= 0:
            raise Invalid(f"rule {text!r} is not a valid interval; write one of: {EXAMPLES}")
        if int(m.group(1)) * _UNITS[m.group(2)] > MAX_INTERVAL_S:
            raise Invalid(f"rule {text!r} is longer than {MAX_INTERVAL_S // 86400} days; use an `at` rule "
                          "for a one-off")
        return Rule(text=s, kind="interval", tz=tz, interval=timedelta(seconds=int(m.group(1)) * _UNITS[m.group(2)]))
    if low.startswith("at "):
        try:
            when = datetime.fromisoformat(s[3:].strip())
        except ValueError as e:
            raise Invalid(f"rule {text!r} has no valid ISO time after `at`; write one of: {EXAMPLES}") from e
        try:
            if when.tzinfo is None:
                when = when.replace(tzinfo=tz)
                if not _exists(when.replace(tzinfo=None), tz):
                    raise Invalid(f"rule {text!r} names a local time that does not exist in {tz_name} (DST gap); "
                                  "pick another time")
            DateTrigger(when, timezone=tz)  # the same validation APScheduler applies
            return Rule(text=s, kind="at", tz=tz, at=when.astimezone(timezone.utc))
        except OverflowError as e:  # year 1 or 9999 shifted across UTC
            raise Invalid(f"rule {text!r} is out of the range of dates; pick a time between years 2 and 9998") from e
    if low.startswith("@"):
        return _macro(text, low, tz)
    fields = s.split(" ")
    if len(fields) != 5:
        raise Invalid(f"rule {text!r} is not a rule; write one of: {EXAMPLES}")
    try:
        trigger = CronTrigger.from_crontab(" ".join([*fields[:4], crontab_weekdays(fields[4])]), timezone=timezone.utc)
    except ValueError as e:
        raise Invalid(f"rule {text!r} is not a valid cron expression ({e}); write one of: {EXAMPLES}") from e
    return Rule(text=s, kind="cron", tz=tz, cron=trigger)


WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def crontab_weekdays(field: str) -> str:
    """Write a cron day-of-week field by name, as crontab counts (0 and 7 are Sunday, 1 is Monday): APScheduler's
    `from_crontab` counts numbers from Monday = 0, so `0 9 * * 1` would fire on Tuesdays. Names pass unchanged."""
    if field == "*" or not any(c.isdigit() for c in field):
        return field
    days: list[int] = []
    for part in field.split(","):
        base, _, step_text = part.partition("/")
        if any(c.isalpha() for c in base):
            raise ValueError(f"day of week {part!r} mixes names and numbers; use one or the other")
        low, _, high = ("0-6" if base == "*" else base).partition("-")
        first, last = int(low), int(high or (6 if step_text else low))
        step = int(step_text or 1)
        if not (0 <= first <= 7 and 0 <= last <= 7) or step < 1 or first > last:
            raise ValueError(f"day of week {part!r} is out of 0-7")
        days += [d % 7 for d in range(first, last + 1, step)]
    return ",".join(WEEKDAYS[d] for d in sorted(set(days)))


def _macro(text: str, low: str, tz: ZoneInfo) -> Rule:
    """Parse a cron macro (`@daily`, …); `@reboot` and unknown macros are refused naming why."""
    if low == "@reboot":
        raise Invalid(REBOOT)
    if low not in MACROS:
        raise Invalid(f"rule {text!r} is not a cron macro; use one of {', '.join(MACROS)}, or write one of: {EXAMPLES}")
    return Rule(text=low, kind="cron", tz=tz, cron=CronTrigger.from_crontab(MACROS[low], timezone=timezone.utc))


def _exists(wall: datetime, tz: ZoneInfo) -> bool:
    """Whether a naive local wall time exists in `tz` (False inside a DST gap)."""
    real = wall.replace(tzinfo=tz).astimezone(timezone.utc)
    return real.astimezone(tz).replace(tzinfo=None) == wall


def next_after(rule: Rule, after: datetime, anchor: datetime | None = None) -> datetime | None:
    """Return the first fire time strictly after `after` (aware UTC), or None when the rule is consumed.

    `anchor` is the instant interval rules count from (the schedule's creation).
    """
    if rule.kind == "at":
        assert rule.at is not None
        return rule.at if rule.at > after else None
    if rule.kind == "interval":
        assert rule.interval is not None
        trig = IntervalTrigger(seconds=rule.interval.total_seconds(), start_date=anchor or after, timezone=timezone.utc)
        return trig.get_next_fire_time(None, after + _TICK)
    # cron: match fields on the local wall clock, then map each wall time to one real instant
    assert rule.cron is not None
    wall = after.astimezone(rule.tz).replace(tzinfo=None)
    for _ in range(SCAN_LIMIT):
        cand = rule.cron.get_next_fire_time(None, wall.replace(tzinfo=timezone.utc) + _TICK)
        if cand is None:
            return None
        wall = cand.replace(tzinfo=None)
        if not _exists(wall, rule.tz):
            continue  # DST gap: this local time never happens
        real = wall.replace(tzinfo=rule.tz, fold=0).astimezone(timezone.utc)  # repeated time: the first one
        if real > after:
            return real
    return None


@dataclass(frozen=True)
class FirePlan:
    """What one due schedule does now: at most one dispatch, at most one collapsed missed row, the next time."""

    dispatch: datetime | None          # nominal time to dispatch, within the grace
    missed_from: datetime | None       # first nominal time of the collapsed misses
    missed_count: int                  # how many nominal times were missed (capped at MAX_WALK)
    next_fire_at: datetime | None      # None: a one-shot rule is consumed


def plan(rule: Rule, due: datetime, now: datetime, grace_s: float, anchor: datetime | None = None) -> FirePlan:
    """Decide a due schedule's fire: late beyond the grace is missed, misses collapse, the rule moves to the future.

    Every nominal time in [due, now] is considered: the latest one is dispatched when it is no more than
    `grace_s` late; every earlier one (and the latest too when it is later than the grace) is missed.
    """
    times = [due]
    nxt = next_after(rule, due, anchor)
    while nxt is not None and nxt <= now and len(times) < MAX_WALK:
        times.append(nxt)
        nxt = next_after(rule, nxt, anchor)
    if nxt is not None and nxt <= now:  # walked too far: jump straight to the future
        nxt = next_after(rule, now, anchor)
    latest = times[-1]
    dispatch = latest if (now - latest).total_seconds() <= grace_s else None
    missed = times[:-1] if dispatch is not None else times
    return FirePlan(dispatch, missed[0] if missed else None, len(missed), nxt)


def first_fire(rule: Rule, now: datetime, anchor: datetime | None = None) -> datetime | None:
    """Return the first fire time after `now` for a new (or resumed) schedule."""
    return next_after(rule, now, anchor or now)
