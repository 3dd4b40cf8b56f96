"""Card rendering is pure: view model → Card JSON 2.0, checked snapshot-style, within Feishu's limits."""
from __future__ import annotations

import pytest

from bot.cards.actions import BadPayload, CardAction, Help, Link, Login, Overview, Save, parse_text
from bot.cards.alert_center import render_alert_center
from bot.cards.alerts import render as render_notice
from bot.cards.base import MAX_CARD_BYTES, MAX_ELEMENTS, count_elements, size_bytes
from bot.cards.overview import render_overview
from bot.cards.schedules import render_detail, render_history, render_list, render_results, split_result
from bot.cards.views import (AlertCenterView, Diagnostic, HistoryView, IncidentItem, Outcome, OverviewView,
                             ResultsView, ScheduleDetailView, ScheduleItem, ScheduleListView)
from bot.i18n import Catalogs

TR = Catalogs()


def walk(node, fn):  # noqa: ANN001, ANN201
    fn(node)
    if isinstance(node, dict):
        for v in node.values():
            walk(v, fn)
    elif isinstance(node, list):
        for v in node:
            walk(v, fn)


def check_card(card: dict) -> None:
    """Card JSON 2.0 rules every card obeys."""
    assert card["schema"] == "2.0" and card["config"]["locales"] == ["en_us", "zh_cn"]
    assert size_bytes(card) <= MAX_CARD_BYTES and count_elements(card) <= MAX_ELEMENTS

    def rules(node):  # noqa: ANN001, ANN202
        if isinstance(node, dict):
            assert node.get("tag") != "action", "Card 2.0 has no action rows"
            if "i18n_content" in node:
                assert set(node["i18n_content"]) == {"en_us", "zh_cn"}
                assert node["content"] == node["i18n_content"]["en_us"]
            if node.get("tag") == "button":
                (behavior,) = node["behaviors"]
                assert behavior["type"] == "callback"
                assert CardAction.unpack(behavior["value"]).pack() == behavior["value"]
    walk(card, rules)

    def buttons_in_columns(node):  # noqa: ANN001, ANN202
        if isinstance(node, dict) and node.get("tag") == "column_set":
            for col in node["columns"]:
                assert col["tag"] == "column"
    walk(card, buttons_in_columns)
    body_tags = [e["tag"] for e in card["body"]["elements"]]
    assert "button" not in body_tags, "buttons live inside a column_set"


INCIDENT = {"v": 1, "kind": "incident", "incident_id": "inc_1", "app_id": "cli_1", "schedule_id": "sch_1",
            "schedule_name": "nightly", "creator": "alice", "status": "open", "failures": 2, "missed": 0, "unknowns": 0,
            "last_outcome": "failed", "opened_at": "2026-01-05T09:00:00+00:00", "acknowledged": False,
            "snoozed_until": None, "notice": "card"}


def _values(card: dict) -> list[dict]:
    out: list[dict] = []
    walk(card,
         lambda n: out.append(n["behaviors"][0]["value"]) if isinstance(n, dict) and n.get("tag") == "button"
         else None)
    return out


def test_pushed_incident_card_buttons_are_router_payloads_ack_snooze_recheck_and_no_pause():
    values = _values(render_notice(INCIDENT))
    actions = [CardAction.unpack(v) for v in values]   # the router accepts every one of them
    assert [(a.op, a.incident_id, a.view) for a in actions] == [
        ("ack", "inc_1", "inc"), ("snooze", "inc_1", "inc"), ("recheck", "inc_1", "inc")]
    assert values[0] == {"p": "amux", "v": 1, "op": "ack", "i": "inc_1", "vw": "inc"}


def test_acknowledged_incident_card_keeps_only_recheck_and_closed_card_has_no_buttons():
    assert [CardAction.unpack(v).op for v in _values(render_notice({**INCIDENT, "acknowledged": True}))] == ["recheck"]
    assert _values(render_notice({**INCIDENT, "status": "closed"})) == []


def test_digest_card_acts_per_incident_and_answers_with_the_alert_center():
    card = render_notice({"v": 1, "kind": "digest", "app_id": "cli_1",
                          "items": [INCIDENT, {**INCIDENT, "incident_id": "inc_2"}]})
    actions = [CardAction.unpack(v) for v in _values(card)]
    assert [(a.op, a.incident_id, a.view) for a in actions] == [
        ("ack", "inc_1", ""), ("snooze", "inc_1", ""), ("ack", "inc_2", ""), ("snooze", "inc_2", ""),
        ("recheck", None, "")]


OVERVIEW = OverviewView(viewer="alice", total=3, failing=1, paused=1,
                        latest=(Outcome("nightly", "2026-01-05T09:00:00+00:00", "failed"),), is_admin=False)


def test_overview_snapshot():
    card = render_overview(OVERVIEW, TR)
    check_card(card)
    els = card["body"]["elements"]
    assert card["header"]["title"]["i18n_content"] == {"en_us": "amux overview", "zh_cn": "amux 概览"}
    assert els[1]["i18n_content"] == {
        "en_us": "**Your schedules**: 3 · **failing**: 1 · **paused**: 1",
        "zh_cn": "**你的定时任务**：3 · **失败中**：1 · **已暂停**：1"}
    assert els[2]["i18n_content"]["en_us"] == "**Latest outcomes**\n- nightly · 2026-01-05 17:00 Asia/Shanghai · failed"
    assert els[2]["i18n_content"]["zh_cn"] == "**最新结果**\n- nightly · 2026-01-05 17:00 Asia/Shanghai · 失败"
    assert els[-1]["tag"] == "column_set" and len(els[-1]["columns"]) == 2  # Personal schedules · New schedule
    assert els[-1]["columns"][1]["elements"][0]["behaviors"][0]["value"] == {"p": "amux", "v": 1, "op": "new"}
    assert els[-1]["columns"][0]["elements"][0]["behaviors"][0]["value"] == {"p": "amux", "v": 1, "op": "schedules"}


def test_admin_overview_has_both_entries_in_one_row():
    from dataclasses import replace
    card = render_overview(replace(OVERVIEW, is_admin=True, active_incidents=2), TR)
    check_card(card)
    rows = [e for e in card["body"]["elements"] if e["tag"] == "column_set"]
    assert len(rows) == 1
    ops = [c["elements"][0]["behaviors"][0]["value"]["op"] for c in rows[0]["columns"]]
    assert ops == ["schedules", "alerts", "new"]  # the two entries side by side, then New schedule


def test_user_text_is_escaped():
    card = render_overview(OverviewView(viewer="<at id=all></at>", total=0, failing=0, paused=0), TR)
    assert "\\<at id=all\\>" in card["body"]["elements"][0]["content"]


@pytest.mark.parametrize("card", [
    render_list(ScheduleListView(tuple(ScheduleItem(schedule_id=f"sch_{i}", name=f"job {i}", rule="every 1h",
                                                    paused=i % 2 == 0,
                                                    next_fire_at="2026-01-05T10:00:00+00:00",
                                                    last="succeeded") for i in range(5)),
                                 page=1, pages=3, total=13), TR),
    render_list(ScheduleListView((), 0, 1, 0), TR),
    render_detail(ScheduleDetailView(schedule_id="sch_1", name="nightly", rule="cron 0 2 * * *",
                                     timezone="Asia/Shanghai", schedule_type="subtask", paused=False,
                                     next_fire_at="2026-01-06T02:00:00+08:00",
                                     recent=(Outcome("nightly", None, "unknown"),)), TR),
    render_detail(ScheduleDetailView(schedule_id="sch_1", name="nightly", rule="every 1h", timezone="UTC",
                                     schedule_type="subtask", paused=True, next_fire_at=None), TR),
    render_history(HistoryView(schedule_id="sch_1", name="nightly",
                               firings=tuple(Outcome("n", None, "missed") for _ in range(10)), page=2, has_more=True),
                   TR),
    render_results(ResultsView(schedule_id="sch_1", name="n", page=0, pages=2, part=1, parts=3,
                               firing=Outcome("n", None, "succeeded"), text="x" * 9000), TR),
    render_results(ResultsView(schedule_id="sch_1", name="n", page=0, pages=0, part=0, parts=0), TR),
    render_alert_center(AlertCenterView(app_id="cli_1",
                                        incidents=tuple(IncidentItem(incident_id=f"inc_{i}", schedule_name="nightly",
                                                                     creator="alice", state="open", failures=2,
                                                                     missed=1, unknowns=0, last_outcome="failed",
                                                                     acknowledged=i == 0, snoozed_until=None)
                                                        for i in range(5)),
                                        page=0, pages=2, delivery_state="suspended",
                                        diagnostics=(Diagnostic(state="suspended", code="230013"),)), TR),
    render_notice(INCIDENT),
    render_notice({**INCIDENT, "notice": "reminder"}),
    render_notice({**INCIDENT, "acknowledged": True}),
    render_notice({"v": 1, "kind": "digest", "app_id": "cli_1",
                   "items": [INCIDENT, {**INCIDENT, "incident_id": "inc_2"}]}),
    render_notice({"v": 1, "kind": "digest", "app_id": "cli_1", "items": [{**INCIDENT, "incident_id": f"inc_{i}"}
                                                                          for i in range(500)]}),
])
def test_every_card_obeys_card_2_rules(card: dict):
    check_card(card)


def test_list_pagination_buttons():
    card = render_list(ScheduleListView((), page=1, pages=3, total=13), TR)
    values = []
    walk(card,
         lambda n: values.append(n["behaviors"][0]["value"])
         if isinstance(n, dict) and n.get("tag") == "button" else None)
    assert {"p": "amux", "v": 1, "op": "schedules"} in values          # previous = page 0
    assert {"p": "amux", "v": 1, "op": "schedules", "pg": 2} in values
    assert {"p": "amux", "v": 1, "op": "overview"} in values           # back


def test_results_split_keeps_every_part_under_the_limit():
    text = "長い结果 <b>*x*</b>\n" * 5000
    parts = split_result(text)
    assert len(parts) > 5 and all(len(p.encode()) <= 9000 for p in parts)
    assert "".join(parts).replace("\\", "") == text
    for i, part in enumerate(parts):
        check_card(render_results(ResultsView(schedule_id="sch_1", name="n", page=0, pages=1, part=i, parts=len(parts),
                                              firing=Outcome("n", None, "succeeded"), text=part),
                                  TR))


def _failure_text(v: ResultsView) -> dict[str, str]:
    card = render_results(v, TR)
    check_card(card)
    md = [e["i18n_content"] for e in card["body"]["elements"] if "Outcome" in e.get("content", "")]
    return md[0] if md else {}


@pytest.mark.parametrize(("state", "error", "en", "zh"), [
    # the outcome word from the catalog; the error in the hub's words, escaped as user text
    ("failed", "exit 2: <at id=all></at> *x*",
     "**Outcome**: failed\n**Error**: exit 2: \\<at id=all\\>\\</at\\> \\*x\\*",
     "**结果**：失败\n**错误**：exit 2: \\<at id=all\\>\\</at\\> \\*x\\*"),
    ("timed_out", "ran past 600 s",
     "**Outcome**: timed out\n**Error**: ran past 600 s", "**结果**：超时\n**错误**：ran past 600 s"),
    # no error recorded: said so, in the person's language
    ("cancelled", "", "**Outcome**: cancelled\nThe hub recorded no error for this run.",
     "**结果**：已取消\n本次运行没有记录错误。"),
])
def test_an_unsuccessful_runs_results_card_names_the_outcome_and_the_error(state: str, error: str, en: str, zh: str):
    text = _failure_text(ResultsView(schedule_id="sch_1", name="n", page=0, pages=1, part=0, parts=1,
                                     firing=Outcome("n", None, state), error=error))
    assert text == {"en_us": en, "zh_cn": zh}


def test_a_successful_runs_results_card_has_no_failure_and_a_long_error_is_cut():
    assert _failure_text(ResultsView(schedule_id="sch_1", name="n", page=0, pages=1, part=0, parts=1,
                                     firing=Outcome("n", None, "succeeded"), error="ignored")) == {}
    text = _failure_text(ResultsView(schedule_id="sch_1", name="n", page=0, pages=1, part=0, parts=1,
                                     firing=Outcome("n", None, "failed"), text="x" * 9000, error="<" * 50_000))
    assert text["en_us"].endswith("\\<" * 1000 + "…")
    # the widest error (CJK, three bytes a character) beside the fullest part still fits one card
    _failure_text(ResultsView(schedule_id="sch_1", name="n", page=0, pages=1, part=0, parts=1,
                              firing=Outcome("n", None, "failed"), text="<" * 4500, error="错" * 50_000))


@pytest.mark.parametrize("value", [
    None, "x", {"p": "alert", "v": 1, "op": "ack"}, {"p": "amux", "v": 2, "op": "overview"},
    {"p": "amux", "v": 1, "op": "rm -rf"}, {"p": "amux", "v": 1, "op": "pause"},
    {"p": "amux", "v": 1, "op": "detail", "s": 5}, {"p": "amux", "v": 1, "op": "schedules", "pg": -1},
    {"p": "amux", "v": 1, "op": "schedules", "pg": True}, {"p": "amux", "v": 1, "op": "ack"},
    {"p": "alert", "v": 1, "a": "pause", "i": "inc_1", "app": "cli_1"},   # the retired alert-card shape
    {"p": "amux", "v": 1, "op": "ack", "i": "inc_1", "vw": "x"}, {"p": "amux", "v": 1, "op": "recheck", "vw": "inc"},
])
def test_bad_payloads_are_refused(value):  # noqa: ANN001
    with pytest.raises(BadPayload):
        CardAction.unpack(value)


def test_payload_round_trip():
    a = CardAction.of("results", schedule_id="sch_1", page=3, sub=2)
    assert a.pack() == {"p": "amux", "v": 1, "op": "results", "s": "sch_1", "pg": 3, "sub": 2}
    assert CardAction.unpack(a.pack()) == a


@pytest.mark.parametrize("overlap,en,zh", [
    ("allow", "allowed (runs may overlap)", "允许"),
    ("skip", "skip while the previous run is unfinished", "跳过"),
    ("replace", "cancel the unfinished previous run and replace it", "替换"),
])
def test_the_schedule_card_shows_the_overlap_setting_in_both_languages(overlap, en, zh):
    card = render_detail(ScheduleDetailView(schedule_id="sch_1", name="nightly", rule="@daily", timezone="UTC",
                                            schedule_type="subtask", paused=False, next_fire_at=None,
                                            overlap=overlap), TR)
    head = card["body"]["elements"][0]["i18n_content"]
    assert f"**Overlap**: {en}" in head["en_us"] and "**重叠运行**：" in head["zh_cn"] and zh in head["zh_cn"]


def test_a_session_prompt_card_shows_no_overlap_line():
    card = render_detail(ScheduleDetailView(schedule_id="sch_1", name="nudge", rule="@hourly", timezone="UTC",
                                            schedule_type="session-prompt", paused=False, next_fire_at=None), TR)
    assert "Overlap" not in card["body"]["elements"][0]["i18n_content"]["en_us"]


def test_every_payload_class_has_exactly_one_route_and_ops_come_from_the_classes():
    from bot.cards.actions import ACTIONS, COMMANDS
    from bot.router import ROUTES, route

    assert set(ROUTES) == set(ACTIONS.values()) | set(COMMANDS.values())
    assert {cls.op for cls in ACTIONS.values()} == set(ACTIONS)
    assert route(CardAction.of("overview")).handler is route(parse_text("/amux")).handler


@pytest.mark.parametrize("text,payload", [
    ("/amux", Overview()), ("amux", Overview()), ("  /AMUX  ", Overview()), ("/amux help", Help()),
    ("/amux login", Login()), ("/amux link AB-CD", Link(code="AB-CD")), ("/amux link", Link(code="")),
    ("/amux nonsense x", Help(unknown="nonsense")), ("hello", None), ("", None), ("/amuxx help", None),
])
def test_text_commands_parse_into_the_routers_payloads(text: str, payload: object):
    assert parse_text(text) == payload


def test_a_field_another_op_takes_is_refused_and_every_op_packs_what_it_unpacks():
    with pytest.raises(BadPayload, match="overview takes no schedule_id"):
        CardAction.unpack({"p": "amux", "v": 1, "op": "overview", "s": "sch_1"})
    with pytest.raises(BadPayload, match="save needs the form's nonce"):
        CardAction.unpack({"p": "amux", "v": 1, "op": "save"})
    assert CardAction.unpack({"p": "amux", "v": 1, "op": "save", "n": "f1"}) == Save(nonce="f1")
