"""Alert rules, table-style: each case is (state, event, now) → expected step, one commented case per rule."""
from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from hub.domain import alerts as r

T0 = datetime(2026, 1, 5, 3, 0, tzinfo=timezone.utc)  # 11:00 in Asia/Shanghai: outside quiet hours
N = r.Numbers()
S = timedelta(seconds=1)


def inc(state: str = "open", **kw) -> r.Incident:
    base = dict(opened_at=T0, failures=1, notified_at=T0, last_ping_at=T0)
    base.update(kw)
    return r.Incident(state=state, **base)


OUTCOME_CASES = [
    # recurring success is quiet
    ("recurring_success_is_quiet", None, r.Outcome(outcome="succeeded"), (), "quiet_success", None),
    # a schedule without an attributable creator gets no proactive notice (no fallback recipient)
    ("no_creator_no_notice", None, r.Outcome(outcome="failed", has_creator=False), (), "no_creator", None),
    # no attributable Feishu application: no notice either
    ("no_app_no_notice", None, r.Outcome(outcome="failed", has_app=False), (), "no_app", None),
    # a failure opens a pending incident whose first notice waits the 60 s aggregation
    ("failure_aggregated_60s", None, r.Outcome(outcome="failed"), (), "aggregated", ("pending", T0 + 60 * S)),
    # a missed run is aggregated like a failure
    ("missed_aggregated_60s", None, r.Outcome(outcome="missed", missed_count=2), (), "aggregated",
     ("pending", T0 + 60 * S)),
    # a refused dispatch (admission error, runtime offline) is trouble too
    ("refused_dispatch_is_failure", None, r.Outcome(outcome=None, admission="skipped:offline"), (), "aggregated",
     ("pending", T0 + 60 * S)),
    # an overlap skip (the previous run still going) is admission, not an outcome: neither failure nor missed run
    ("overlap_skip_is_not_trouble", None, r.Outcome(outcome=None, admission="skipped:overlap"), (),
     "overlap_skipped", None),
    # … nor a receipt for a creator who asked for every outcome
    ("overlap_skip_no_receipt_with_notify_all", None,
     r.Outcome(outcome=None, admission="skipped:overlap", notify="all"), (), "overlap_skipped", None),
    # an unknown outcome waits five minutes
    ("unknown_waits_5min", None, r.Outcome(outcome="unknown"), (), "waiting_unknown", ("pending", T0 + 300 * S)),
    # a failure inside the window only adds to the count (one card later)
    ("failure_inside_window_aggregates", inc("pending", notify_at=T0 + 60 * S), r.Outcome(outcome="failed"), (),
     "aggregated", ("pending", T0 + 60 * S)),
    # a failure after an unknown brings the notice forward to the aggregation window
    ("failure_after_unknown_shortens_wait", inc("pending", failures=0, unknowns=1, notify_at=T0 + 300 * S),
     r.Outcome(outcome="failed"), (), "aggregated", ("pending", T0 + 60 * S)),
    # a success before an unknown-only incident's wait ends withdraws it without a notice
    ("unknown_then_success_withdrawn", inc("pending", failures=0, unknowns=1, notify_at=T0 + 300 * S),
     r.Outcome(outcome="succeeded"), (), "withdrawn", ("withdrawn", None)),
    # an ongoing incident updates its card in place
    ("ongoing_failure_updates_card", inc("open"), r.Outcome(outcome="failed"), ("update",), "updated", ("open", None)),
    # success on an open incident starts recovery (card updated)
    ("success_starts_recovery", inc("open"), r.Outcome(outcome="succeeded"), ("update",), "recovering",
     ("recovering", None)),
    # trouble during recovery re-opens the incident
    ("failure_during_recovery_reopens", inc("recovering", recovering_since=T0), r.Outcome(outcome="failed"),
     ("update",), "updated", ("open", None)),
    # one-shot terminal outcomes receive a receipt
    ("one_shot_receipt", None, r.Outcome(outcome="succeeded", one_shot=True), ("receipt",), "receipt", None),
    # a cancelled run is not trouble
    ("cancelled_is_quiet", None, r.Outcome(outcome="cancelled"), (), "quiet_cancelled", None),
]


@pytest.mark.parametrize("name,state,outcome,notices,decision,expect", OUTCOME_CASES, ids=[c[0] for c in OUTCOME_CASES])
def test_outcome_rules(name, state, outcome, notices, decision, expect):
    step = r.on_outcome(state, outcome, T0, N)
    assert step.notices == notices
    assert step.decision == decision
    if expect is not None:
        assert step.incident.state == expect[0]
        if expect[1] is not None:
            assert step.incident.notify_at == expect[1]


@pytest.mark.parametrize("state", [None, inc("pending", notify_at=T0 + 60 * S), inc("open"),
                                   inc("recovering", recovering_since=T0)])
def test_an_overlap_skip_neither_opens_nor_updates_an_incident(state):
    step = r.on_outcome(state, r.Outcome(outcome=None, admission="skipped:overlap"), T0, N)
    assert step.incident is state and step.notices == () and step.decision == "overlap_skipped"


TICK_CASES = [
    # nothing before the aggregation window ends
    ("pending_waits_until_window_ends", inc("pending", notify_at=T0 + 60 * S), T0 + 59 * S, None),
    # the first card goes out when the window ends
    ("pending_opens_card_after_window", inc("pending", notify_at=T0 + 60 * S), T0 + 60 * S, ("card", "opened", "open")),
    # no reminder within a day of the last ping
    ("no_reminder_within_a_day", inc("open"), T0 + 86399 * S, None),
    # at most one unacknowledged reminder per day
    ("reminder_after_a_day", inc("open"), T0 + 86400 * S, ("reminder", "reminder", "open")),
    # acknowledge stops reminders
    ("acknowledged_no_reminder", inc("open", acked_at=T0), T0 + 3 * 86400 * S, None),
    # snooze holds reminders for 24 hours
    ("snoozed_no_reminder", inc("open", snoozed_until=T0 + 2 * 86400 * S), T0 + 86400 * S, None),
    # recovery closes the card after ten stable minutes, not before
    ("recovery_not_closed_before_10min", inc("recovering", recovering_since=T0), T0 + 599 * S, None),
    ("recovery_closes_after_10min", inc("recovering", recovering_since=T0), T0 + 600 * S,
     ("update", "closed", "closed")),
]


@pytest.mark.parametrize("name,state,now,expect", TICK_CASES, ids=[c[0] for c in TICK_CASES])
def test_time_rules(name, state, now, expect):
    step = r.on_tick(state, now, N)
    if expect is None:
        assert step is None
    else:
        assert (step.notices[0], step.decision, step.incident.state) == expect


def test_acknowledge_and_snooze_set_their_marks():
    # acknowledge records when; snooze lasts 24 hours; both refresh the card in place
    a = r.acknowledge(inc("open"), T0)
    assert a.incident.acked_at == T0 and a.notices == ("update",)
    s = r.snooze(inc("open"), T0, N)
    assert s.incident.snoozed_until == T0 + 86400 * S and s.notices == ("update",)


def test_acknowledge_records_who_and_the_comment_snooze_takes_a_duration_and_unsnooze_lifts_it():
    a = r.acknowledge(inc("open"), T0, "ou_boss", "on it")
    assert (a.incident.acked_at, a.incident.acked_by, a.incident.ack_comment) == (T0, "ou_boss", "on it")
    assert r.acknowledge(inc("open"), T0, "ops", "").incident.ack_comment is None   # an empty comment is none
    s = r.snooze(inc("open"), T0, N, 4 * 3600)
    assert s.incident.snoozed_until == T0 + 4 * 3600 * S and s.decision == "snoozed"
    u = r.unsnooze(s.incident, T0 + S)
    assert u.incident.snoozed_until is None and u.notices == ("update",) and u.decision == "unsnoozed"
    # a reminder held by the snooze is due again at once
    assert r.on_tick(u.incident, T0 + 86400 * S, N).decision == "reminder"


def test_admin_change_clears_ack_and_snooze_but_keeps_counts():
    # recipient-specific state goes; execution state stays
    x = r.retarget(inc("open", failures=4, acked_at=T0, acked_by="ou_old", ack_comment="mine", snoozed_until=T0 + S))
    assert x.acked_at is None and x.acked_by is None and x.ack_comment is None and x.snoozed_until is None
    assert x.failures == 4


@pytest.mark.parametrize("text,seconds", [
    ("30m", 1800), ("4h", 14400), ("1d", 86400), ("1h30m", 5400), ("2w", 1209600), ("90", 90), (" 4H ", 14400),
])
def test_durations_read_as_an_operator_writes_them(text, seconds):
    assert r.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "4 hours", "4x", "0m", "0", "1.5h", "-1h", "m30"])
def test_a_duration_that_is_not_one_is_refused_with_examples(text):
    with pytest.raises(ValueError, match="30m"):
        r.parse_duration(text)


SH = "Asia/Shanghai"
APP = r.AppState("ou_admin")
GATE_CASES = [
    # missing administrator configuration keeps the notice pending (hold) with a diagnostic
    ("missing_admin_holds", "card", None, r.AppState(None), [], T0, ("hold", "missing_admin")),
    ("unknown_app_holds", "card", None, None, [], T0, ("hold", "missing_admin")),
    # a suspended application holds every notice until recheck
    ("suspended_holds", "update", "ou_admin", r.AppState("ou_admin", "suspended"), [], T0, ("hold", "suspended")),
    # a notice addressed to a former administrator is retired, never sent to anyone else
    ("old_admin_retired", "card", "ou_old", APP, [], T0, ("retire", "retired")),
    # quiet hours (22:00–08:00 local) defer new messages to 08:00
    ("quiet_hours_defer_to_0800", "card", "ou_admin", APP, [], datetime(2026, 1, 5, 15, 0, tzinfo=timezone.utc),
     ("defer", "quiet_hours", datetime(2026, 1, 6, 0, 0, tzinfo=timezone.utc))),
    ("quiet_hours_after_midnight", "reminder", "ou_admin", APP, [], datetime(2026, 1, 5, 18, 30, tzinfo=timezone.utc),
     ("defer", "quiet_hours", datetime(2026, 1, 6, 0, 0, tzinfo=timezone.utc))),
    # in-place updates are allowed during quiet hours
    ("update_allowed_in_quiet_hours", "update", "ou_admin", APP, [], datetime(2026, 1, 5, 15, 0, tzinfo=timezone.utc),
     ("send", "sent")),
    # at most three new messages per administrator/application in 30 minutes; the fourth folds into a digest
    ("fourth_new_message_folds", "card", "ou_admin", APP, [T0 - 60 * S, T0 - 30 * S, T0 - 10 * S], T0,
     ("fold", "rate_limited", T0 - 60 * S + 1800 * S)),
    ("three_in_window_then_free", "card", "ou_admin", APP, [T0 - 1801 * S, T0 - 30 * S, T0 - 10 * S], T0,
     ("send", "sent")),
    # the digest waits for the next free slot instead of folding
    ("digest_waits_for_free_slot", "digest", "ou_admin", APP, [T0 - 60 * S, T0 - 30 * S, T0 - 10 * S], T0,
     ("defer", "rate_limited", T0 - 60 * S + 1800 * S)),
    # updates never count against the rate limit
    ("update_not_rate_limited", "update", "ou_admin", APP, [T0, T0, T0], T0, ("send", "sent")),
]


@pytest.mark.parametrize("name,kind,recipient,app,slots,now,expect", GATE_CASES, ids=[c[0] for c in GATE_CASES])
def test_outbox_gate(name, kind, recipient, app, slots, now, expect):
    g = r.gate(kind, recipient, SH, app, slots, now, N)
    assert (g.action, g.decision) == expect[:2]
    if len(expect) > 2:
        assert g.until == expect[2]


def test_quiet_hours_off_when_empty():
    # "" turns quiet hours off
    assert r.quiet_until(datetime(2026, 1, 5, 15, 0, tzinfo=timezone.utc), SH, "") is None


RETRY_CASES = [
    # a transient failure retries with backoff inside the dedup window
    ("transient_retries", "retry", 1, T0, T0 + 10 * S, None, ("pending", "retry")),
    # 429 honours x-ogw-ratelimit-reset
    ("rate_limit_reset_honoured", "retry", 1, T0, T0, 7.0, ("pending", "retry", T0 + 7 * S)),
    # past Feishu's one-hour dedup window the notice becomes unconfirmed (never a possible duplicate)
    ("past_dedup_window_unconfirmed", "retry", 9, T0, T0 + 3599 * S, None, ("unconfirmed", "unconfirmed")),
    # 230013/230053 suspend (the notice stays pending)
    ("suspend_keeps_pending", "suspend", 1, T0, T0, None, ("pending", "suspended")),
    # other permanent errors end the notice
    ("permanent_is_dead", "permanent", 1, T0, T0, None, ("dead", "dead")),
]


@pytest.mark.parametrize("name,verdict,attempts,first,now,reset,expect", RETRY_CASES, ids=[c[0] for c in RETRY_CASES])
def test_delivery_failures(name, verdict, attempts, first, now, reset, expect):
    state, nxt, decision = r.after_failure(verdict, attempts, first, now, reset, N)
    assert (state, decision) == expect[:2]
    if len(expect) > 2:
        assert nxt == expect[2]


def test_card_updates_only_within_14_days():
    # Feishu updates a card only within 14 days of sending; older ones get a fresh card
    assert r.card_patchable(T0, T0 + timedelta(days=13, hours=23), N)
    assert not r.card_patchable(T0, T0 + timedelta(days=14), N)
    assert not r.card_patchable(None, T0, N)


def test_next_tick_tracks_reminders_and_recovery():
    assert r.next_tick(inc("open"), N) == T0 + 86400 * S
    assert r.next_tick(replace(inc("recovering"), recovering_since=T0), N) == T0 + 600 * S
