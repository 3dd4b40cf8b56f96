"""Coordination delegations: a task submitted with an amux-session:<id> token keeps that parent session."""
from __future__ import annotations

from ...domain.resolution import SessionContext
from ...store.db import Connection
from ...store.sessions import SqlSessionStore
from ..auth.service import Caller

SESSION_LABEL = "amux-session:"


def own_session_id(caller: Caller) -> str | None:
    """Return the session an `amux-session:<id>` token belongs to (an agent's own Session), else None."""
    if caller.label and caller.label.startswith(SESSION_LABEL) and len(caller.label) > len(SESSION_LABEL):
        return caller.label[len(SESSION_LABEL):]
    return None


async def delegation_parent(conn: Connection, caller: Caller) -> tuple[str | None, str | None, SessionContext | None]:
    """Return (parent session id, its active Turn id, its current choices) for an amux-session token.

    Other initiators never infer a parent: any other label gives (None, None, None).
    """
    if not caller.label or not caller.label.startswith(SESSION_LABEL):
        return None, None, None
    parent = await SqlSessionStore.delegation_parent(conn, caller.label[len(SESSION_LABEL):], caller.principal_id)
    if parent is None:
        return None, None, None
    return parent.session_id, parent.active_turn_id, SessionContext(parent.engine, parent.model,
                                                                    parent.reasoning_effort)
