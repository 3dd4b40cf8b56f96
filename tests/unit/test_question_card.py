"""The question card (pure): its buttons are exactly the payloads the router accepts for `answer`."""
from __future__ import annotations

import pytest

from bot.cards.actions import BadPayload, CardAction
from bot.cards.question import render_answered, render_question
from bot.handlers import questions
from bot.i18n import Catalogs
from bot.router import check
from tests.fakes.feishu import card_buttons, card_text

QUESTION = {"question_id": "q_1", "turn_id": "turn_1", "text": "Which database?", "options": ["PostgreSQL", "SQLite"],
            "free_text": True, "state": "open"}


def values(card: dict) -> list[dict]:
    return [b["behaviors"][0]["value"] for b in card_buttons(card)]


def test_every_button_of_the_question_card_routes_to_answer_with_its_option():
    card = render_question(Catalogs(), QUESTION)
    routed = [check(v) for v in values(card)]
    assert [(a.op, a.question_id, a.option, h) for a, h in routed] == [
        ("answer", "q_1", 0, questions.answer), ("answer", "q_1", 1, questions.answer)]


def test_the_card_is_bilingual_and_says_a_chat_reply_answers_too():
    card = render_question(Catalogs(), QUESTION)
    assert "reply to this chat" in card_text(card) and "回复你自己的答案" in card_text(card, "zh_cn")
    closed = render_question(Catalogs(), {**QUESTION, "free_text": False})
    assert "reply to this chat" not in card_text(closed)


def test_question_text_is_escaped_and_the_answered_card_has_no_buttons():
    card = render_question(Catalogs(), {**QUESTION, "text": "use [x](http://evil) *now*"})
    assert "[x](http://evil)" not in card_text(card)
    assert values(render_answered(Catalogs(), QUESTION, "SQLite")) == []


@pytest.mark.parametrize("value, why", [
    ({"p": "amux", "v": 1, "op": "answer"}, "answer without a question"),
    ({"p": "amux", "v": 1, "op": "answer", "q": "q_1", "o": -1}, "negative option"),
    ({"p": "amux", "v": 1, "op": "answer", "q": "q_1", "o": 50}, "option past the last one a question may have"),
    ({"p": "amux", "v": 1, "op": "answer", "q": "q_1", "o": True}, "boolean option"),
    ({"p": "amux", "v": 1, "op": "answer", "q": "", "o": 0}, "empty question id"),
    ({"p": "amux", "v": 1, "op": "overview", "q": "q_1"}, "a question on another operation"),
])
def test_malformed_answer_payloads_are_refused(value, why):
    with pytest.raises(BadPayload):
        CardAction.unpack(value)


def test_an_answer_payload_round_trips():
    a = CardAction.of("answer", question_id="q_9", option=3)
    assert CardAction.unpack(a.pack()) == a
