"""Parsers that take text from outside: any input is parsed or refused with the project's error, never anything else.

The scripted-engine language (hub/domain/scripted.py), schedule rules (hub/domain/schedule_rules.py) and lease
handles (hub/domain/leases.py). `make fuzz` runs these with many more examples (AMUX_PROPERTY_EXAMPLES).
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hub.domain import leases, schedule_rules, scripted
from hub.errors import Invalid

EXAMPLES = int(os.environ.get("AMUX_PROPERTY_EXAMPLES", "300"))
PROFILE = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# text a user could type: every code point, with the characters the parsers split on made likely
WORDY = st.text(st.characters(codec="utf-8") | st.sampled_from(" \t'\"=.#_-:+/*,0123456789²٣"), max_size=60)
ZONES = st.sampled_from(["UTC", "Asia/Shanghai", "America/New_York", "Pacific/Kiritimati", "Etc/GMT+12",
                         "Etc/GMT-14", "Europe/London", "", " UTC", "Nowhere/City", "../etc"])


# --- the scripted engine ----------------------------------------------------------------------------

@PROFILE
@given(st.lists(st.tuples(st.sampled_from(scripted.COMMANDS + ("", "#", "nope")), WORDY), max_size=6))
@example([("usage", "input=²")])
@example([("sleep", "1e400")])
@example([("wait-steer", "nan")])
@example([("tool", "'unclosed")])
def test_a_script_is_parsed_or_refused_with_invalid(lines):
    script = "\n".join(f"{op} {rest}" for op, rest in lines)
    try:
        steps = scripted.parse(script)
    except Invalid as e:
        assert str(e).startswith("scripted line ")
        return
    for step in steps:
        assert step.op in scripted.COMMANDS
        if step.op in ("sleep", "wait-steer"):
            assert 0 <= step.seconds <= 86400
        for _key, n in step.numbers:
            assert n >= 0


@PROFILE
@given(st.text(max_size=200))
def test_arbitrary_text_as_a_script_is_parsed_or_refused(text):
    try:
        scripted.parse(text)
    except Invalid:
        pass


# --- schedule rules ---------------------------------------------------------------------------------

CRON_FIELD = st.text(st.sampled_from("0123456789*/,-?LW#abcdefjmnorstuwyAB"), min_size=1, max_size=8)
RULES = st.one_of(
    st.text(max_size=80),
    st.builds(lambda n, u: f"every {n}{u}", st.integers(-5, 10**25) | st.just("٣"), st.sampled_from("smhdxS ")),
    st.builds(lambda d: f"at {d}", st.datetimes().map(lambda d: d.isoformat()) | WORDY),
    st.builds(lambda d, off: f"at {d.isoformat()}{off}", st.datetimes(),
              st.sampled_from(["", "Z", "+14:00", "-12:00", "+23:59"])),
    st.lists(CRON_FIELD, min_size=5, max_size=5).map(" ".join),
)


@PROFILE
@given(RULES, ZONES)
@example("at 0001-01-01T00:00:00", "Asia/Shanghai")
@example("at 9999-12-31T23:59:59", "America/New_York")
@example("at 0001-01-01T00:00:00+14:00", "UTC")
@example("every 99999999999999999999d", "UTC")
@example("0 0 31 2 *", "UTC")
def test_a_rule_is_parsed_or_refused_with_invalid(text, tz):
    try:
        rule = schedule_rules.parse(text, tz)
    except Invalid as e:
        assert str(e)
        return
    assert rule.kind in ("cron", "interval", "at")
    if rule.kind == "interval":
        assert 0 < rule.interval.total_seconds() <= schedule_rules.MAX_INTERVAL_S


# --- lease handles ----------------------------------------------------------------------------------

ID_CHARS = "0123456789abcdefghjkmnpqrstvwxyzA._-"
HANDLES = st.one_of(
    st.none(), st.text(max_size=250),
    st.builds(lambda i, s: f"task_{i}.{s}", st.text(st.sampled_from(ID_CHARS), max_size=45),
              st.text(st.sampled_from(ID_CHARS + "+/="), max_size=140)),
)


@PROFILE
@given(HANDLES)
@example("task_abc.s3cret")
@example(" task_abc.s3cret ")
@example("task_²." + "a")
def test_a_lease_handle_is_parsed_or_refused_with_handle_error(raw):
    try:
        handle = leases.parse_handle(raw)
    except leases.HandleError as e:
        assert "task" in str(e)
    else:
        assert leases.format_handle(handle.task_id, handle.secret) == raw.strip()
    try:
        assert leases.parse_task_id(raw).startswith("task_")
    except leases.HandleError:
        pass
    try:
        assert leases.parse_box_id(raw).startswith("vm_")
    except leases.HandleError:
        pass


@PROFILE
@given(st.none() | st.text(max_size=300), st.booleans())
def test_a_lease_name_is_cleaned_or_refused_with_a_value_error(raw, required):
    try:
        name = leases.clean_name(raw, required=required, what="task")
    except ValueError:
        return
    assert name is None or (0 < len(name) <= leases.MAX_NAME_CHARS and name.isprintable())
