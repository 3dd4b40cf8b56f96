"""The chat's cards (pure): the progress card, the final card for each outcome, and answers split, never cut."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from bot.cards.base import MAX_CARD_BYTES, size_bytes
from bot.cards.chat import ChatCardRenderer, elapsed, split_answer
from bot.i18n import catalogs
from hub.config import AlertSettings
from hub.domain import alerts as rules
from hub.domain.tasks import RUNTIME_LOST
from hub.services.chat.turns import ChatView
from tests.fakes.feishu import card_buttons, card_text

R = ChatCardRenderer(catalogs())


def view(status: str, **turn) -> ChatView:
    return ChatView(turn_id="turn_1", turn={"status": status, **turn}, elapsed_s=65,
                    tools=[{"id": "a", "title": "read the notes", "status": "running"},
                           {"id": "a", "title": "read the notes", "status": "completed"}], notes=[])


def test_an_answer_longer_than_one_card_is_split_at_boundaries_and_nothing_is_cut():
    text = "\n\n".join(f"paragraph {i} " + "字" * 3000 for i in range(10)) + "\n```\n" + "code\n" * 5000 + "```"
    parts = split_answer(text)
    assert len(parts) > 1 and all(len(p.encode()) <= 20_000 for p in parts)
    joined = "".join(parts)
    assert all(f"paragraph {i}" in joined for i in range(10)) and joined.count("code\n") == 5000
    assert all(p.count("```") % 2 == 0 for p in parts)  # a fence cut at a part is closed and reopened
    assert split_answer("  \n ") == [] and split_answer("short") == ["short"]


def test_a_single_line_longer_than_a_part_is_cut_at_characters_and_kept_whole():
    parts = split_answer("é" * 30_000)
    assert "".join(parts) == "é" * 30_000 and len(parts) == 3


@pytest.mark.parametrize(("status", "extra", "title", "what"), [
    ("succeeded", {"result": {"text": "the answer"}}, "Done", "the answer"),
    ("cancelled", {}, "Stopped", "Send a message to start again"),
    ("timed_out", {}, "Timed out", "raise the profile's timeout"),
    ("failed", {"error": RUNTIME_LOST}, "The agent was interrupted", "Send your message again"),
    ("failed", {"error": "boom"}, "The turn failed", "boom"),
])
def test_the_final_card_says_the_outcome_and_what_to_do(status, extra, title, what):
    [card] = R.final(view(status, **extra))
    text = card_text(card) + str(card)
    assert title in card_text(card) and what in text
    assert [b["text"]["content"] for b in card_buttons(card)] == ["Agent Timeline"]
    assert size_bytes(card) <= MAX_CARD_BYTES


def test_the_progress_card_shows_status_tools_by_title_elapsed_time_and_stop():
    card = R.progress(view("running"))
    text = card_text(card)
    assert "Working" in text and "1 min 05 s" in text and "read the notes" in text and "(1)" in text
    stop, timeline = card_buttons(card)
    assert stop["behaviors"][0]["value"] == {"p": "amux", "v": 1, "op": "stop", "t": "turn_1"}
    assert timeline["behaviors"][0]["value"] == {"p": "amux", "v": 1, "op": "timeline", "r": "turn_1", "k": "turn"}
    assert "处理中" in card_text(card, "zh_cn")


def test_elapsed_is_said_shortly():
    assert [elapsed(s) for s in (5, 65, 3725)] == ["5 s", "1 min 05 s", "1 h 02 min"]


@pytest.mark.parametrize(("app", "decision"), [
    (rules.AppState(None, "ok"), "sent"),              # no administrator: a chat still answers its person
    (rules.AppState("ou_admin", "suspended"), "sent"),  # the administrator's suspension is not the chat's
    (None, "missing_admin"),                            # an application the hub does not know holds it
])
def test_a_chat_output_skips_the_administrators_gates(app, decision):
    now = datetime(2026, 1, 5, 3, tzinfo=timezone.utc)  # inside the default quiet hours in Asia/Shanghai
    n = rules.Numbers.of(AlertSettings(), 3600)
    for kind in rules.CHAT_KINDS:
        assert rules.gate(kind, "ou_someone", "Asia/Shanghai", app, [now] * 100, now, n).decision == decision
