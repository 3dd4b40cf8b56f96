"""Schedule rules (DESIGN §6): forms, refusals with examples, DST gap/overlap, missed runs, one-shot consumption."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from hub.domain import schedule_rules as rules
from hub.errors import Invalid

UTC = timezone.utc


def t(*a: int) -> datetime:
    return datetime(*a, tzinfo=UTC)


@pytest.mark.parametrize("text,tz,after,expected", [
    # cron, 5 fields, in UTC
    ("*/5 * * * *", "UTC", t(2026, 1, 5, 9, 1), t(2026, 1, 5, 9, 5)),
    # cron evaluated on the schedule's IANA zone: 09:00 Shanghai is 01:00 UTC
    ("0 9 * * *", "Asia/Shanghai", t(2026, 1, 5, 2, 0), t(2026, 1, 6, 1, 0)),
    # strictly after: a time equal to `after` is not returned again
    ("*/5 * * * *", "UTC", t(2026, 1, 5, 9, 5), t(2026, 1, 5, 9, 10)),
    # intervals count from the anchor (creation); tested with anchor == after below
    ("every 30s", "UTC", t(2026, 1, 5, 9, 0), t(2026, 1, 5, 9, 0, 30)),
    ("every 5m", "UTC", t(2026, 1, 5, 9, 0), t(2026, 1, 5, 9, 5)),
    ("every 2h", "UTC", t(2026, 1, 5, 9, 0), t(2026, 1, 5, 11, 0)),
    # one-shot with an explicit offset
    ("at 2026-12-01T09:00:00+08:00", "UTC", t(2026, 1, 5), t(2026, 12, 1, 1, 0)),
    # one-shot without an offset is read in the schedule's zone
    ("at 2026-12-01T09:00:00", "Asia/Shanghai", t(2026, 1, 5), t(2026, 12, 1, 1, 0)),
])
def test_each_rule_form_computes_its_next_fire_time(text, tz, after, expected):
    rule = rules.parse(text, tz)
    assert rules.next_after(rule, after, anchor=after) == expected


def test_interval_rules_count_from_the_schedule_creation_not_from_now():
    rule = rules.parse("every 5m", "UTC")
    assert rules.next_after(rule, t(2026, 1, 5, 9, 7), anchor=t(2026, 1, 5, 9, 1)) == t(2026, 1, 5, 9, 11)


@pytest.mark.parametrize("bad", [
    "", "   ", "every", "every 0s", "every 5 minutes", "every -1m", "* * * *", "*/5 * * * * *",
    "61 * * * *", "at tomorrow", "at ", "hourly", "*/x * * * *",
])
def test_a_bad_rule_string_is_refused_with_an_example_of_each_form(bad):
    with pytest.raises(Invalid) as e:
        rules.parse(bad, "UTC")
    msg = e.value.message
    assert '"*/5 * * * *"' in msg and '"every 30s"' in msg and '"at 2026-12-01T09:00:00+08:00"' in msg


@pytest.mark.parametrize("tz", ["Mars/Olympus", "", "utc ", "../etc/passwd"])
def test_an_unknown_timezone_is_refused_naming_an_iana_example(tz):
    with pytest.raises(Invalid, match="IANA"):
        rules.parse("*/5 * * * *", tz)


def test_a_cron_local_time_inside_the_dst_gap_is_skipped():
    # 2026-03-08 02:30 does not exist in New York (clocks jump 02:00 → 03:00)
    rule = rules.parse("30 2 * * *", "America/New_York")
    first = rules.next_after(rule, t(2026, 3, 7, 12, 0))
    assert first == t(2026, 3, 9, 6, 30)  # the 9th at 02:30 EDT; the 8th is skipped, not shifted to 03:30


def test_a_cron_local_time_repeated_by_the_dst_overlap_fires_once_the_first():
    # 2026-11-01 01:30 happens twice in New York (EDT, then EST)
    rule = rules.parse("30 1 * * *", "America/New_York")
    first = rules.next_after(rule, t(2026, 10, 31, 12, 0))
    assert first == t(2026, 11, 1, 5, 30)  # 01:30 EDT
    assert rules.next_after(rule, first) == t(2026, 11, 2, 6, 30)  # the next day, not 01:30 EST


def test_a_sub_hourly_cron_rule_walks_forward_through_the_dst_overlap_without_repeats():
    rule = rules.parse("*/30 * * * *", "America/New_York")
    got, at = [], t(2026, 11, 1, 4, 50)
    for _ in range(5):
        at = rules.next_after(rule, at)
        got.append(at)
    # 01:00 EDT, 01:30 EDT, (01:00 EST and 01:30 EST are repeats: skipped), 02:00 EST, 02:30 EST, 03:00 EST
    assert got == [t(2026, 11, 1, 5, 0), t(2026, 11, 1, 5, 30), t(2026, 11, 1, 7, 0), t(2026, 11, 1, 7, 30),
                   t(2026, 11, 1, 8, 0)]
    assert got == sorted(set(got))


def test_interval_rules_count_real_seconds_across_dst():
    rule = rules.parse("every 1h", "America/New_York")
    anchor = t(2026, 3, 8, 5, 0)  # 00:00 EST
    assert rules.next_after(rule, t(2026, 3, 8, 6, 30), anchor) == t(2026, 3, 8, 7, 0)


def test_a_one_shot_local_time_inside_the_dst_gap_is_refused():
    with pytest.raises(Invalid, match="does not exist"):
        rules.parse("at 2026-03-08T02:30:00", "America/New_York")


def test_a_one_shot_rule_is_consumed_after_its_time():
    rule = rules.parse("at 2026-12-01T09:00:00+08:00", "UTC")
    assert rules.next_after(rule, t(2026, 12, 1, 1, 0)) is None
    p = rules.plan(rule, t(2026, 12, 1, 1, 0), t(2026, 12, 1, 1, 0, 5), 60)
    assert p.dispatch == t(2026, 12, 1, 1, 0) and p.next_fire_at is None and p.missed_count == 0


def test_a_one_shot_rule_later_than_the_grace_is_missed_and_consumed_not_retried():
    rule = rules.parse("at 2026-12-01T09:00:00+08:00", "UTC")
    p = rules.plan(rule, t(2026, 12, 1, 1, 0), t(2026, 12, 1, 1, 5), 60)
    assert p.dispatch is None and p.missed_count == 1 and p.next_fire_at is None


@pytest.mark.parametrize("late_s,dispatch", [
    (0, True),     # on time
    (60, True),    # exactly the grace: still dispatched
    (61, False),   # later than the grace: missed
])
def test_a_fire_later_than_the_grace_is_not_dispatched_but_missed(late_s, dispatch):
    rule = rules.parse("0 * * * *", "UTC")
    due = t(2026, 1, 5, 9, 0)
    p = rules.plan(rule, due, due + timedelta(seconds=late_s), 60)
    assert (p.dispatch == due) is dispatch
    assert p.missed_count == (0 if dispatch else 1)
    assert p.next_fire_at == t(2026, 1, 5, 10, 0)


def test_consecutive_misses_collapse_into_one_count_and_the_rule_advances_to_the_next_future_time():
    rule = rules.parse("*/5 * * * *", "UTC")
    due = t(2026, 1, 5, 9, 0)
    now = t(2026, 1, 5, 10, 2)  # down for an hour: 09:00 … 10:00 are 13 nominal times, 10:00 is 2 min late
    p = rules.plan(rule, due, now, 60)
    assert p.dispatch is None and p.missed_from == due and p.missed_count == 13
    assert p.next_fire_at == t(2026, 1, 5, 10, 5)


def test_after_an_outage_the_latest_time_within_the_grace_is_dispatched_and_earlier_ones_are_missed():
    rule = rules.parse("every 30s", "UTC")
    anchor = t(2026, 1, 5, 9, 0)
    due = t(2026, 1, 5, 9, 0, 30)
    now = t(2026, 1, 5, 9, 2, 10)  # nominal 09:00:30 … 09:02:00 (4 times); 09:02:00 is 10 s late
    p = rules.plan(rule, due, now, 60, anchor)
    assert p.dispatch == t(2026, 1, 5, 9, 2, 0)
    assert p.missed_from == due and p.missed_count == 3
    assert p.next_fire_at == t(2026, 1, 5, 9, 2, 30)


def test_a_very_long_outage_caps_the_walk_and_still_lands_in_the_future():
    rule = rules.parse("every 1s", "UTC")
    due = t(2026, 1, 5, 0, 0, 1)
    now = t(2026, 1, 6, 0, 0, 0, )
    p = rules.plan(rule, due, now, 60, t(2026, 1, 5))
    assert p.missed_count <= rules.MAX_WALK and p.next_fire_at > now
    assert p.next_fire_at == now + timedelta(seconds=1)


# --- cron macros (crontab(5)), on the local wall clock of the schedule's zone ------------------------

@pytest.mark.parametrize("macro,tz,after,expected", [
    ("@hourly", "UTC", t(2026, 1, 5, 9, 1), t(2026, 1, 5, 10, 0)),
    ("@daily", "UTC", t(2026, 1, 5, 9, 0), t(2026, 1, 6, 0, 0)),
    ("@midnight", "UTC", t(2026, 1, 5, 9, 0), t(2026, 1, 6, 0, 0)),
    ("@weekly", "UTC", t(2026, 1, 5, 9, 0), t(2026, 1, 11, 0, 0)),     # Sunday 00:00 (5 Jan 2026 is a Monday)
    ("@monthly", "UTC", t(2026, 1, 5, 9, 0), t(2026, 2, 1, 0, 0)),
    ("@yearly", "UTC", t(2026, 1, 5, 9, 0), t(2027, 1, 1, 0, 0)),
    ("@annually", "UTC", t(2026, 1, 5, 9, 0), t(2027, 1, 1, 0, 0)),
    # in the schedule's zone: midnight in Shanghai is 16:00 UTC the day before
    ("@daily", "Asia/Shanghai", t(2026, 1, 5, 9, 0), t(2026, 1, 5, 16, 0)),
    ("@monthly", "Asia/Shanghai", t(2026, 1, 5, 9, 0), t(2026, 1, 31, 16, 0)),
    # any case and surrounding blanks
    (" @DAILY ", "UTC", t(2026, 1, 5, 9, 0), t(2026, 1, 6, 0, 0)),
])
def test_a_cron_macro_fires_like_its_crontab_line_in_the_schedule_timezone(macro, tz, after, expected):
    rule = rules.parse(macro, tz)
    assert rule.kind == "cron" and rule.text == macro.strip().lower()
    assert rules.next_after(rule, after) == expected


def test_reboot_is_refused_naming_why_and_what_to_use_instead():
    with pytest.raises(Invalid) as e:
        rules.parse("@reboot", "UTC")
    assert "replicas" in e.value.message and '"@daily"' in e.value.message


def test_an_unknown_macro_is_refused_listing_the_macros_and_each_rule_form():
    with pytest.raises(Invalid) as e:
        rules.parse("@fortnightly", "UTC")
    assert "@hourly" in e.value.message and "@yearly" in e.value.message and '"every 30s"' in e.value.message


def _walk(rule: rules.Rule, after: datetime, n: int) -> list[datetime]:
    out = []
    for _ in range(n):
        after = rules.next_after(rule, after)
        out.append(after)
    return out


def test_daily_fires_once_a_day_at_local_midnight_across_the_march_dst_change():
    # New York springs forward on 2026-03-08 at 02:00: that day lasts 23 hours
    got = _walk(rules.parse("@daily", "America/New_York"), t(2026, 3, 7, 12, 0), 3)
    assert got == [t(2026, 3, 8, 5, 0), t(2026, 3, 9, 4, 0), t(2026, 3, 10, 4, 0)]  # 00:00 EST, then EDT
    assert [g.astimezone(rules.zone("America/New_York")).hour for g in got] == [0, 0, 0]


def test_daily_fires_once_a_day_at_local_midnight_across_the_november_dst_change():
    # New York falls back on 2026-11-01 at 02:00: that day lasts 25 hours, and midnight happens once
    got = _walk(rules.parse("@daily", "America/New_York"), t(2026, 10, 31, 12, 0), 3)
    assert got == [t(2026, 11, 1, 4, 0), t(2026, 11, 2, 5, 0), t(2026, 11, 3, 5, 0)]  # 00:00 EDT, then EST
    assert [g.astimezone(rules.zone("America/New_York")).hour for g in got] == [0, 0, 0]


def test_hourly_skips_the_missing_hour_and_fires_the_repeated_hour_once():
    rule = rules.parse("@hourly", "America/New_York")
    # spring: 01:00 EST, (02:00 does not exist), 03:00 EDT — consecutive real hours
    assert _walk(rule, t(2026, 3, 8, 5, 30), 2) == [t(2026, 3, 8, 6, 0), t(2026, 3, 8, 7, 0)]
    # autumn: 01:00 EDT, (01:00 EST is a repeat), 02:00 EST — two real hours apart
    assert _walk(rule, t(2026, 11, 1, 4, 30), 2) == [t(2026, 11, 1, 5, 0), t(2026, 11, 1, 7, 0)]


def test_daily_skips_a_day_whose_midnight_falls_in_the_dst_gap_as_the_documented_rule_says():
    # São Paulo (2018) sprang forward at midnight: 2018-11-04 00:00 never happened there
    got = _walk(rules.parse("@daily", "America/Sao_Paulo"), t(2018, 11, 2, 12, 0), 2)
    assert got == [t(2018, 11, 3, 3, 0), t(2018, 11, 5, 2, 0)]


@pytest.mark.parametrize(("rule", "weekdays"), [
    ("0 9 * * 1", {"Mon"}),                 # crontab counts 1 as Monday (APScheduler's own numbers start at Monday = 0)
    ("0 9 * * 0", {"Sun"}), ("0 9 * * 7", {"Sun"}),
    ("0 9 * * 1-5", {"Mon", "Tue", "Wed", "Thu", "Fri"}),
    ("0 9 * * */2", {"Sun", "Tue", "Thu", "Sat"}),
    ("0 9 * * 5-7", {"Fri", "Sat", "Sun"}),
    ("0 9 * * mon,fri", {"Mon", "Fri"}),
])
def test_a_numbered_day_of_week_counts_as_crontab_does_sunday_zero_monday_one(rule, weekdays):
    r = rules.parse(rule, "UTC")
    seen, at = set(), datetime(2026, 12, 2, tzinfo=timezone.utc)
    for _ in range(14):
        at = rules.next_after(r, at)
        seen.add(at.strftime("%a"))
        assert at.hour == 9
    assert seen == weekdays


def test_a_day_of_week_mixing_names_and_numbers_is_refused_naming_the_fix():
    with pytest.raises(Invalid) as e:
        rules.parse("0 9 * * mon-5", "UTC")
    assert "use one or the other" in e.value.message
