"""The question card (pure): the agent of a chat's Session asked its person; each option is a button, and a reply
in the chat answers in free text."""
from __future__ import annotations

from typing import Any

from bot.i18n import Catalogs, _

from .actions import MAX_OPTION, AnswerQuestion
from .base import button, button_row, card, check_limits, esc, hr, markdown, same

LABEL_LIMIT = 60     # characters of an option on its button
TEXT_LIMIT = 4_000   # characters of the question on the card


def answer_action(question_id: str, option: int) -> AnswerQuestion:
    """Return the payload of the button that answers `question_id` with option `option`."""
    return AnswerQuestion(question_id=question_id, option=option)


def render_question(tr: Catalogs, question: dict[str, Any]) -> dict[str, Any]:
    """Render a waiting question (hub.services.tasks.questions.question_view): its text, one button per option and how
    to answer in free text."""
    text = question.get("text") or ""
    elements: list[dict[str, Any]] = [markdown(same(esc(text[:TEXT_LIMIT]) or "…"))]
    options = list(question.get("options") or [])[:MAX_OPTION + 1]
    buttons = [button(same(str(o)[:LABEL_LIMIT]), answer_action(question["question_id"], i),
                      "primary" if i == 0 else "default") for i, o in enumerate(options)]
    if buttons:
        elements.append(button_row(*buttons))
    if question.get("free_text", True):
        elements += [hr(), markdown(tr.text(_("Or reply to this chat with your own answer: your next message is "
                                              "the answer.")))]
    return check_limits(card(tr.text(_("The agent asks")), elements, template="turquoise"))


def render_answered(tr: Catalogs, question: dict[str, Any], answer: str) -> dict[str, Any]:
    """Render the question card once answered: the question, the answer chosen and no buttons left to press."""
    text = question.get("text") or ""
    elements = [markdown(same(esc(text[:TEXT_LIMIT]) or "…")), hr(),
                markdown(tr.text(_("Answered: **{answer}**. The agent continues with it."), answer=esc(answer)))]
    return check_limits(card(tr.text(_("The agent asks")), elements, template="green"))
