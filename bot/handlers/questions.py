"""Questions in a chat's Session: the question card's buttons answer it as the Session's next Turn.

A Turn whose agent asked a structured question ends `waiting_for_user`; the bot posts the question card in its
place (`outcome_reply`). Pressing an option sends it as the next Turn (resumed with the provider's handle) and the
card turns into a receipt; a chat reply answers in free text the same way (any next Turn of the Session answers).
A second answer, or one after the Turn was cancelled, is refused with a toast naming what to do; nothing changes.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bot.cards.actions import AnswerQuestion
from bot.cards.question import render_answered, render_question
from bot.i18n import Catalogs, _
from hub.domain.tasks import Status
from hub.services.questions import QuestionClosed

from .context import Answer, Ctx, handles

if TYPE_CHECKING:
    from bot.feishu.messenger import Outgoing
    from bot.identity import Viewer
    from bot.services import BotServices

ANSWER_LIMIT = 20_000  # characters of the agent's answer posted back in one text message

REFUSED = {
    "answered": _("This question was already answered (turn {turn}); nothing changed. Reply in the chat to go on."),
    "cancelled": _("This question's turn ({turn}) was cancelled, so it takes no answer; nothing changed. "
                   "Send a new message to start again."),
}


@handles(AnswerQuestion)
async def answer(ctx: Ctx, action: AnswerQuestion) -> Answer:
    """Send the option pressed as the next Turn of the question's Session; the card becomes a receipt."""
    v = ctx.viewer
    receipt = {"app_id": v.app_id, "binding_id": v.binding_id, "open_id": v.open_id}
    try:
        sent = await ctx.services.sessions.answer_question(v.caller(), action.question_id, option=action.option,
                                                           source="feishu", receipt=receipt)
    except QuestionClosed as e:
        return Answer(toast=REFUSED[e.reason], toast_kind="warning", toast_values=tuple(e.values.items()))
    return Answer(card=render_answered(ctx.tr, sent["question"], sent["answer"]),
                  toast=_("Answer sent; the agent's reply follows in this chat."), follow_turn=sent["turn_id"])


def outcome_reply(tr: Catalogs, view: dict[str, Any]) -> tuple[str, dict]:
    """Return (msg_type, content) posting a Turn's outcome: the question card when it waits for its person, else
    its answer text (or its error, or its status)."""
    question = view.get("question")
    if view.get("status") == Status.WAITING_FOR_USER and question and question.get("state") == "open":
        return "interactive", render_question(tr, question)
    result = (view.get("result") or {}).get("text") if isinstance(view.get("result"), dict) else None
    text = result or view.get("error") or f"[{view.get('status')}]"
    return "text", {"text": text[:ANSWER_LIMIT]}


async def post_turn(services: BotServices, tr: Catalogs, viewer: Viewer, turn_id: str, reply_to: str,
                    out: Outgoing, wait_s: float) -> None:
    """Wait for the Turn and post its outcome under `reply_to` (its own question card if it asks again)."""
    view = await services.sessions.wait_turn(viewer.caller(), turn_id, timeout_s=wait_s)
    msg_type, content = outcome_reply(tr, view)
    await out.reply(viewer.app_id, reply_to, msg_type, content, f"amux-{turn_id}")


async def turn_reply(services: BotServices, tr: Catalogs, viewer: Viewer, turn_id: str) -> tuple[str, dict] | None:
    """Return the question card reply for a Turn that ended on a question, or None for any other outcome."""
    view = await services.sessions.get_turn(viewer.caller(), turn_id)
    msg_type, content = outcome_reply(tr, view)
    return (msg_type, content) if msg_type == "interactive" else None
