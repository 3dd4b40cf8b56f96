"""Questions a direct Session's agent asked its person: one per Turn that ended `waiting_for_user`."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from ..domain.tasks import Status
from .db import Connection, Database
from .records import record as read_record
from .tables import session_questions, task_runs

OPEN, ANSWERED, WITHDRAWN = "open", "answered", "withdrawn"


@dataclass(frozen=True, kw_only=True)
class NewQuestion:
    """A question as its Turn ends: the Turn, its session and owner, the text and the options offered."""

    id: str
    turn_id: str
    session_id: str
    owner_id: str
    text: str
    options: list[str]
    free_text: bool


@dataclass(frozen=True, kw_only=True)
class QuestionRecord(NewQuestion):
    """A question with every column of `session_questions` (and, read by id, its Turn's status)."""

    state: str
    answer: str | None
    answer_turn_id: str | None
    created_at: datetime
    closed_at: datetime | None
    turn_status: str | None = None


class SqlQuestionStore:
    """Session questions and the one answer each may get, in SQL."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @staticmethod
    async def record(conn: Connection, new: NewQuestion, now: datetime) -> None:
        """Store the question of a Turn that ended waiting for the person, open; a Turn's second report adds none.

        Static: it takes no lock, so the runner-report path (`hub.services.tasks.questions.record_question`) can use it.
        """
        exists = (await conn.execute(sa.select(session_questions.c.id).where(
            session_questions.c.turn_id == new.turn_id))).first()
        if exists is None:
            await conn.execute(session_questions.insert().values(
                id=new.id, turn_id=new.turn_id, session_id=new.session_id, owner_id=new.owner_id, text=new.text,
                options=list(new.options), free_text=new.free_text, state=OPEN, created_at=now))

    async def get(self, conn: Connection, question_id: str) -> QuestionRecord | None:
        """Return the question with its Turn's status (`turn_status`), or None when there is no such question."""
        return read_record(QuestionRecord, (await conn.execute(
            sa.select(session_questions, task_runs.c.status.label("turn_status"))
            .join(task_runs, task_runs.c.id == session_questions.c.turn_id)
            .where(session_questions.c.id == question_id))).mappings().first())

    async def of_turn(self, conn: Connection, turn_id: str) -> QuestionRecord | None:
        """Return the question the Turn `turn_id` ended on, in any state, or None when it asked none."""
        return read_record(QuestionRecord, (await conn.execute(sa.select(session_questions).where(
            session_questions.c.turn_id == turn_id))).mappings().first())

    async def waiting(self, conn: Connection, session_id: str) -> QuestionRecord | None:
        """Return the session's open question whose Turn still waits for the person (the latest), or None."""
        return read_record(QuestionRecord, (await conn.execute(
            sa.select(session_questions)
            .join(task_runs, task_runs.c.id == session_questions.c.turn_id)
            .where(session_questions.c.session_id == session_id, session_questions.c.state == OPEN,
                   task_runs.c.status == Status.WAITING_FOR_USER.value)
            .order_by(session_questions.c.created_at.desc(), session_questions.c.id.desc()).limit(1))).mappings()
            .first())

    async def answer(self, conn: Connection, question_id: str, answer: str, answer_turn_id: str,
                     now: datetime) -> bool:
        """Mark an open question answered by the Turn `answer_turn_id`; False, with nothing written, when it is not
        open (answered or withdrawn before: a question takes one answer)."""
        res = await conn.execute(session_questions.update().where(
            session_questions.c.id == question_id, session_questions.c.state == OPEN)
            .values(state=ANSWERED, answer=answer, answer_turn_id=answer_turn_id, closed_at=now))
        return res.rowcount == 1

    async def cancel_waiting_turn(self, conn: Connection, turn_id: str, now: datetime) -> bool:
        """Cancel a Turn that waits for the person and withdraw its open question; False, with nothing written, when
        the Turn does not wait (a running Turn is cancelled through its runner instead)."""
        res = await conn.execute(task_runs.update().where(
            task_runs.c.id == turn_id, task_runs.c.status == Status.WAITING_FOR_USER.value)
            .values(status=Status.CANCELLED.value, outcome=Status.CANCELLED.value,
                    error="cancelled while waiting for the person's answer"))
        if res.rowcount == 0:
            return False
        await conn.execute(session_questions.update().where(
            session_questions.c.turn_id == turn_id, session_questions.c.state == OPEN)
            .values(state=WITHDRAWN, closed_at=now))
        return True
