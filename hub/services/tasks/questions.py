"""Questions in direct Sessions: a Turn's agent asked its person; the answer is the Session's next Turn.

The seed: direct Sessions leave questions to their attached UI (a Feishu chat's question card, `amux session get`
and `session_get`). A Turn that ended `waiting_for_user` keeps its question open until the next Turn of its Session
answers it — a button on the card, a chat reply, `session_send` — or until the Turn is cancelled. A question takes
one answer; a second one, or one after the cancel, is refused with nothing changed.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

from ...errors import Conflict, Invalid, NotFound
from ...ids import new_id
from ...runner import protocol as p
from ...store.db import Connection
from ...store.ports.tasks import QuestionStore
from ...store.questions import ANSWERED, NewQuestion, QuestionRecord, SqlQuestionStore


class QuestionClosed(Conflict):
    """The question takes no answer any more: it was answered (`reason` "answered") or its Turn was cancelled."""

    def __init__(self, message: str, reason: str, values: dict[str, Any]) -> None:
        super().__init__(message)
        self.reason = reason
        self.values = values


async def record_question(conn: Connection, run: Any, question: p.Question, now: datetime) -> None:
    """Store the question a direct Session's Turn (`run`, its task_runs row) ended on."""
    await SqlQuestionStore.record(conn, NewQuestion(
        id=new_id("q"), turn_id=run.id, session_id=run.session_id, owner_id=run.owner_id, text=question.text,
        options=list(question.options), free_text=question.free_text), now)


def question_view(q: QuestionRecord | None) -> dict | None:
    """Return what clients show of a question (None for none): id, Turn, text, options, whether free text answers,
    its state and, once answered, the answer and the Turn that carried it."""
    if q is None:
        return None
    return {"question_id": q.id, "turn_id": q.turn_id, "text": q.text, "options": list(q.options or []),
            "free_text": bool(q.free_text), "state": q.state, "answer": q.answer, "answer_turn_id": q.answer_turn_id}


def closed(q: QuestionRecord) -> QuestionClosed | None:
    """Return why the question takes no answer, or None while it still waits for one."""
    if q.state == ANSWERED:
        return QuestionClosed(
            f"question {q.id} was already answered (turn {q.answer_turn_id}); nothing changed — reply in the chat "
            f"or use session_send to continue the session", "answered", {"turn": q.answer_turn_id or ""})
    if q.state != "open" or q.turn_status != "waiting_for_user":
        return QuestionClosed(
            f"question {q.id} can no longer be answered: its turn {q.turn_id} was cancelled; nothing changed — "
            f"send a new message (or session_send) to start again", "cancelled", {"turn": q.turn_id})
    return None


def chosen_answer(q: QuestionRecord, option: int | None, text: str | None) -> str:
    """Return the answer text: the option at index `option`, or free `text` when the question allows it."""
    if option is not None:
        options = list(q.options or [])
        if not 0 <= option < len(options):
            raise Invalid(f"question {q.id} has {len(options)} option(s); pick one of them or answer in free text")
        return str(options[option])
    if not isinstance(text, str) or not text.strip():
        raise Invalid("the answer is empty; pick an option or write some text")
    if not q.free_text and text.strip() not in (q.options or []):
        raise Invalid(f"question {q.id} takes one of its options: {', '.join(q.options)}")
    return text.strip()


async def answerable(store: QuestionStore, conn: Connection, question_id: str, owner_id: str,
                     admin: bool = False) -> QuestionRecord:
    """Return the caller's question that still waits for an answer; refuse one that is gone, another's or closed."""
    q = await store.get(conn, question_id)
    if q is None or (q.owner_id != owner_id and not admin):
        raise NotFound(f"no question {question_id!r} of yours; `amux session get` (session_get) shows a session's "
                       f"waiting question")
    refusal = closed(q)
    if refusal is not None:
        raise refusal
    return q
