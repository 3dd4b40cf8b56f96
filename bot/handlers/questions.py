"""Questions in a chat's Session: the question card's buttons answer it as the Session's next Turn.

A Turn whose agent asked a structured question ends `waiting_for_user`; its progress card becomes the question card
(bot.cards.chat). Pressing an option sends it as the next Turn (resumed with the provider's handle), on its own
progress card under the question card, and the question card turns into a receipt; a chat reply answers in free
text the same way (any next Turn of the Session answers). A second answer, or one after the Turn was cancelled,
is refused with a toast naming what to do; nothing changes.
"""
from __future__ import annotations

from bot.cards.actions import AnswerQuestion
from bot.cards.question import render_answered
from bot.i18n import _
from hub.services.tasks.questions import QuestionClosed

from .context import Answer, Ctx, handles
from .conversation import origin

REFUSED = {
    "answered": _("This question was already answered (turn {turn}); nothing changed. Reply in the chat to go on."),
    "cancelled": _("This question's turn ({turn}) was cancelled, so it takes no answer; nothing changed. "
                   "Send a new message to start again."),
}


@handles(AnswerQuestion)
async def answer(ctx: Ctx, action: AnswerQuestion) -> Answer:
    """Send the option pressed as the next Turn of the question's Session, on its own progress card under the
    question card; the question card becomes a receipt."""
    v = ctx.viewer
    receipt = ctx.receipt or {}
    card_id = receipt.get("open_message_id") or ""
    chat_id = receipt.get("open_chat_id") or card_id
    where = origin(v, chat_id, "", card_id)
    try:
        sent = await ctx.services.chats.answered(v.caller(), where, action.question_id, action.option)
    except QuestionClosed as e:
        return Answer(toast=REFUSED[e.reason], toast_kind="warning", toast_values=tuple(e.values.items()))
    return Answer(card=render_answered(ctx.tr, sent["question"], sent["answer"]),
                  toast=_("Answer sent; the agent's reply follows in this chat."))
