"""Coordination delegations: a task submitted with an amux-session:<id> token keeps that parent session."""
from __future__ import annotations

import sqlalchemy as sa

from ..domain.resolution import SessionContext
from ..domain.tasks import Status
from ..store.tables import sessions, task_runs
from .auth import Caller

SESSION_LABEL = "amux-session:"


async def delegation_parent(conn, caller: Caller) -> tuple[str | None, str | None, SessionContext | None]:  # noqa: ANN001
    """Return (parent session id, its active Turn id, its current choices) for an amux-session token.

    Other initiators never infer a parent: any other label gives (None, None, None).
    """
    if not caller.label or not caller.label.startswith(SESSION_LABEL):
        return None, None, None
    sid = caller.label[len(SESSION_LABEL):]
    s = (await conn.execute(sa.select(sessions).where(sessions.c.id == sid))).first()
    if s is None or s.owner_id != caller.principal_id:
        return None, None, None
    active = (await conn.execute(sa.select(task_runs.c.id).where(
        task_runs.c.session_id == sid, task_runs.c.status == Status.RUNNING.value)
        .order_by(task_runs.c.turn_seq.desc()).limit(1))).scalar()
    return sid, active, SessionContext(s.engine, s.model, s.reasoning_effort)
