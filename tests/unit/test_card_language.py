"""The words and times on every card: user text escaped on every card kind,
no English inside the zh-CN alert cards, the Snooze label from `alerts.snooze_s`, legacy history as unconfirmed,
and every time with its zone."""
from __future__ import annotations

import re

import pytest

from bot.cards.alert_center import render_alert_center
from bot.cards.alerts import render as render_notice
from bot.cards.help import render_help
from bot.cards.identity import render_link_result
from bot.cards.overview import render_overview
from bot.cards.question import render_answered, render_question
from bot.cards.schedule_form import FormView, render_form
from bot.cards.schedules import render_deleted, render_detail, render_history, render_list, render_results
from bot.cards.views import (AlertCenterView, Diagnostic, HistoryView, IncidentItem, Outcome, OverviewView,
                             ResultsView, ScheduleDetailView, ScheduleItem, ScheduleListView)
from bot.i18n import Catalogs, _
from tests.unit.test_cards import check_card, walk

TR = Catalogs()
MENTION, LINK = "<at id=all></at>", "[x](http://evil.example/)"
NASTY = f"{MENTION} {LINK}"


def markdown_texts(card: dict, lang: str | None = None) -> list[str]:
    """Every markdown text of a card (each language, or one)."""
    out: list[str] = []

    def grab(node):
        if isinstance(node, dict) and node.get("tag") == "markdown":
            texts = node.get("i18n_content") or {"en_us": node["content"], "zh_cn": node["content"]}
            out.extend(t for k, t in texts.items() if lang is None or k == lang)
    walk(card, grab)
    return out


def incident(**kw) -> dict:
    return {"v": 1, "kind": "incident", "incident_id": "inc_1", "app_id": "cli_1", "schedule_id": "sch_1",
            "schedule_name": NASTY, "creator": NASTY, "timezone": "Asia/Shanghai", "status": "open", "failures": 2,
            "missed": 0, "unknowns": 0, "last_outcome": "failed", "opened_at": "2026-01-05T09:00:00+00:00",
            "acknowledged": False, "snoozed_until": None, "notice": "card", **kw}


CARD_KINDS = {
    "incident": lambda: render_notice(incident()),
    "incident_acknowledged": lambda: render_notice(incident(acknowledged=True, acked_at="2026-01-05T10:00:00+00:00",
                                                            acked_by=NASTY, ack_comment=NASTY)),
    "receipt": lambda: render_notice({"v": 1, "kind": "receipt", "schedule_name": NASTY, "creator": NASTY,
                                      "outcome": "succeeded", "nominal_time": "2026-01-05T09:00:00+00:00",
                                      "timezone": "UTC"}),
    "digest": lambda: render_notice({"v": 1, "kind": "digest", "items": [incident(), incident(incident_id="inc_2")]}),
    "alert_center": lambda: render_alert_center(AlertCenterView(app_id="cli_1", incidents=(IncidentItem(
        incident_id="inc_1", schedule_name=NASTY, creator=NASTY, state="open", failures=1, missed=0, unknowns=0,
        last_outcome="failed", acknowledged=False, snoozed_until=None),), page=0, pages=1), TR),
    "overview": lambda: render_overview(OverviewView(viewer=NASTY, total=1, failing=0, paused=0,
                                                     latest=(Outcome(NASTY, None, "succeeded"),)), TR),
    "schedule_list": lambda: render_list(ScheduleListView((ScheduleItem(
        schedule_id="sch_1", name=NASTY, rule="every 1h", paused=False, next_fire_at=None),), 0, 1, 1), TR),
    "schedule_detail": lambda: render_detail(ScheduleDetailView(schedule_id="sch_1", name=NASTY, rule="every 1h",
                                                                timezone="UTC", schedule_type="subtask", paused=False,
                                                                next_fire_at=None), TR),
    "history": lambda: render_history(HistoryView(schedule_id="sch_1", name=NASTY,
                                                  firings=(Outcome(NASTY, None, "failed"),), page=0, has_more=False),
                                      TR),
    "results": lambda: render_results(ResultsView(schedule_id="sch_1", name=NASTY, page=0, pages=1, part=0, parts=1,
                                                  firing=Outcome(NASTY, None, "failed"), text="x", error=NASTY), TR),
    "deleted": lambda: render_deleted(NASTY, TR),
    "question": lambda: render_question(TR, {"question_id": "q_1", "text": NASTY, "options": ["a"]}),
    "answered": lambda: render_answered(TR, {"question_id": "q_1", "text": NASTY}, NASTY),
    "link_result": lambda: render_link_result(TR, _("Linked to **{principal}**."), ok=True, principal=NASTY),
    "help_unknown_command": lambda: render_help(TR, unknown=NASTY),
    "schedule_form": lambda: render_form(FormView(nonce="f1", error_field="name", error_detail=NASTY), TR),
}


@pytest.mark.parametrize("kind", sorted(CARD_KINDS))
def test_user_text_is_escaped_on_every_card_kind(kind: str):
    card = CARD_KINDS[kind]()
    check_card(card)
    texts = markdown_texts(card)
    assert any("\\<at id=all\\>" in t for t in texts), f"{kind}: the user text is not on the card"
    for t in texts:
        assert MENTION not in t and "<at id=all>" not in t, f"{kind}: a live mention in {t!r}"
        assert "[x](" not in t, f"{kind}: a live link in {t!r}"


ALLOWED_LATIN = {"amux", "alerts", "explain", "hub", "Asia", "Shanghai", "UTC", "feishu", "apps", "admin_open_id",
                 "ID", "Recheck"}


def english_words(text: str) -> set[str]:
    """Latin words of three letters or more that are not names, ids, zones or commands the catalog keeps."""
    return {w for w in re.findall(r"[A-Za-z_]{3,}", text) if w not in ALLOWED_LATIN}


ZH_CARDS = {
    "refused_dispatch_last_outcome": lambda: render_notice(incident(
        schedule_name="夜间报告", creator="张三",
        last_outcome="error:the schedule has no attributable creator; recreate it")),
    "receipt_skipped_offline": lambda: render_notice({"v": 1, "kind": "receipt", "schedule_name": "夜间报告",
                                                      "creator": "张三", "outcome": "skipped:offline",
                                                      "nominal_time": "2026-01-05T09:00:00+00:00"}),
    "receipt_error": lambda: render_notice({"v": 1, "kind": "receipt", "schedule_name": "夜间报告", "creator": "张三",
                                            "outcome": "error:profile 'x' is unknown; amux profile list names them",
                                            "nominal_time": "2026-01-05T09:00:00+00:00"}),
    "receipt_overlap": lambda: render_notice({"v": 1, "kind": "receipt", "schedule_name": "夜间报告", "creator": "张三",
                                              "outcome": "skipped:overlap"}),
    "alert_center_suspended": lambda: render_alert_center(AlertCenterView(
        app_id="cli_1", incidents=(IncidentItem(incident_id="inc_1", schedule_name="夜间报告", creator="张三",
                                                state="open", failures=1, missed=0, unknowns=0,
                                                last_outcome="skipped:offline", acknowledged=False,
                                                snoozed_until="2026-01-05T09:00:00+00:00"),),
        page=0, pages=1, delivery_state="suspended",
        diagnostics=(Diagnostic(state="suspended", code="230013"),
                     Diagnostic(state="unconfirmed", notice_kind="update", code="1500"),
                     Diagnostic(state="dead", notice_kind="receipt", code="230002"))), TR),
    "alert_center_unconfigured": lambda: render_alert_center(AlertCenterView(
        app_id="cli_1", incidents=(), page=0, pages=1, delivery_state="unconfigured",
        diagnostics=(Diagnostic(state="unconfigured"),)), TR),
    "alert_center_ok": lambda: render_alert_center(AlertCenterView(app_id="cli_1", incidents=(), page=0, pages=1), TR),
}


@pytest.mark.parametrize("kind", sorted(ZH_CARDS))
def test_zh_cn_alert_cards_carry_no_english_every_word_from_the_catalog(kind: str):
    card = ZH_CARDS[kind]()
    check_card(card)
    for text in markdown_texts(card, "zh_cn"):
        assert not english_words(text), f"{kind}: English in the zh-CN card: {english_words(text)} in {text!r}"
    en = " ".join(markdown_texts(card, "en_us"))
    assert "recreate it" not in en and "profile list" not in en   # the hub's raw reason is not pasted in either


def test_a_refused_dispatch_and_one_shot_receipts_name_their_outcome_in_words():
    card = ZH_CARDS["receipt_skipped_offline"]()
    assert "no runtime with its engine was online" in " ".join(markdown_texts(card, "en_us"))
    assert "没有带该引擎的运行环境在线" in " ".join(markdown_texts(card, "zh_cn"))
    card = ZH_CARDS["refused_dispatch_last_outcome"]()
    assert "**Last outcome**: not admitted" in " ".join(markdown_texts(card, "en_us"))


def _labels(card: dict) -> list[dict]:
    out: list[dict] = []
    walk(card, lambda n: out.append(n["text"]["i18n_content"]) if isinstance(n, dict) and n.get("tag") == "button"
         else None)
    return out


@pytest.mark.parametrize("snooze_s, en, zh", [(86400, "Snooze 24 h", "暂缓 24 小时"),
                                              (4 * 3600, "Snooze 4 h", "暂缓 4 小时"),
                                              (1800, "Snooze 30 min", "暂缓 30 分钟")])
def test_the_snooze_label_follows_alerts_snooze_s_on_every_alert_card(snooze_s: float, en: str, zh: str):
    cards = [render_notice(incident(snooze_s=snooze_s)),
             render_notice({"v": 1, "kind": "digest", "items": [incident(snooze_s=snooze_s)]}),
             render_alert_center(AlertCenterView(app_id="cli_1", incidents=(IncidentItem(
                 incident_id="inc_1", schedule_name="n", creator="a", state="open", failures=1, missed=0, unknowns=0,
                 last_outcome="failed", acknowledged=False, snoozed_until=None),), page=0, pages=1,
                 snooze_s=snooze_s), TR)]
    for card in cards:
        assert {"en_us": en, "zh_cn": zh} in _labels(card)


def test_legacy_history_shows_as_unconfirmed_on_the_personal_history_card():
    card = render_history(HistoryView(schedule_id="sch_1", name="n", page=0, has_more=False,
                                      firings=(Outcome("n", "2026-01-05T09:00:00+00:00", "unconfirmed"),)), TR)
    assert "unconfirmed" in markdown_texts(card, "en_us")[0] and "未确认" in markdown_texts(card, "zh_cn")[0]
    assert "unknown" not in markdown_texts(card, "en_us")[0]


ZONED = "2026-01-05T09:00:00+00:00"


@pytest.mark.parametrize("kind, expected", [
    ("incident", "2026-01-05 04:00 America/New_York"),
    ("receipt", "2026-01-05 04:00 America/New_York"),
    ("alert_center", "2026-01-05 17:00 Asia/Shanghai"),
    ("overview", "2026-01-05 17:00 Asia/Shanghai"),
    ("list", "2026-01-05 10:00 Europe/Paris"),
    ("detail", "2026-01-05 10:00 Europe/Paris"),
    ("history", "2026-01-05 09:00 UTC"),
    ("results", "2026-01-05 18:00 Asia/Tokyo"),
])
def test_every_time_on_a_card_shows_its_zone(kind: str, expected: str):
    cards = {
        "incident": lambda: render_notice(incident(timezone="America/New_York", opened_at=ZONED)),
        "receipt": lambda: render_notice({"v": 1, "kind": "receipt", "schedule_name": "n", "nominal_time": ZONED,
                                          "timezone": "America/New_York"}),
        "alert_center": lambda: render_alert_center(AlertCenterView(app_id="cli_1", incidents=(IncidentItem(
            incident_id="inc_1", schedule_name="n", creator="a", state="open", failures=1, missed=0, unknowns=0,
            last_outcome="failed", acknowledged=False, snoozed_until=ZONED),), page=0, pages=1), TR),
        "overview": lambda: render_overview(OverviewView(viewer="a", total=1, failing=0, paused=0,
                                                         latest=(Outcome("n", ZONED, "failed"),)), TR),
        "list": lambda: render_list(ScheduleListView((ScheduleItem(schedule_id="s", name="n", rule="every 1h",
                                                                   paused=False, next_fire_at=ZONED,
                                                                   timezone="Europe/Paris"),), 0, 1, 1), TR),
        "detail": lambda: render_detail(ScheduleDetailView(schedule_id="s", name="n", rule="every 1h",
                                                           timezone="Europe/Paris", schedule_type="subtask",
                                                           paused=False, next_fire_at=ZONED,
                                                           recent=(Outcome("n", ZONED, "failed"),)), TR),
        "history": lambda: render_history(HistoryView(schedule_id="s", name="n", page=0, has_more=False,
                                                      firings=(Outcome("n", ZONED, "failed"),)), TR),
        "results": lambda: render_results(ResultsView(schedule_id="s", name="n", page=0, pages=1, part=0, parts=1,
                                                      firing=Outcome("n", ZONED, "succeeded"), text="x",
                                                      timezone="Asia/Tokyo"), TR),
    }
    card = cards[kind]()
    text = " ".join(markdown_texts(card, "en_us") + markdown_texts(card, "zh_cn"))
    assert expected in text
    assert not re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d(?! [A-Z][A-Za-z_]+(/[A-Za-z_]+)?)", text), text
