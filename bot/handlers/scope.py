"""Creator scope of personal views: frozen creator, application scope and an active identity binding."""
from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from bot.i18n import _
from bot.identity import Viewer

from hub.store.tables import identity_bindings, schedules

from .context import Refused

NOT_YOURS = _("This schedule does not exist or is not yours.")


def owned_filter(v: Viewer, include_deleted: bool = False) -> Any:
    """Return the WHERE clause of schedules the viewer may see in this application.

    The creator is the frozen `creator_id`; a schedule created through another application is not shown
    here; one created through a Feishu binding needs that binding to be active still.
    """
    active = sa.select(identity_bindings.c.id).where(identity_bindings.c.status == "active",
                                                     identity_bindings.c.principal_id == v.principal_id)
    clause = sa.and_(schedules.c.creator_id == v.principal_id,
                     sa.or_(schedules.c.app_id.is_(None), schedules.c.app_id == v.app_id),
                     sa.or_(schedules.c.creator_binding_id.is_(None), schedules.c.creator_binding_id.in_(active)))
    return clause if include_deleted else sa.and_(clause, schedules.c.deleted_at.is_(None))


async def owned(conn, v: Viewer, schedule_id: str, include_deleted: bool = False) -> Any:  # noqa: ANN001
    """Return the viewer's schedule row or refuse (the same answer whether absent or someone else's)."""
    row = (await conn.execute(sa.select(schedules).where(schedules.c.id == schedule_id,
                                                         owned_filter(v, include_deleted)))).first()
    if row is None:
        raise Refused(NOT_YOURS)
    return row


def firing_state(f: Any) -> str:
    """Return what a firing shows: its reconciled outcome, else what admission said."""
    if f.outcome:
        return f.outcome
    adm = f.admission or ""
    if adm == "ok":
        return "pending"
    if adm.startswith("skipped"):
        return "skipped"
    if adm.startswith("error"):
        return "error"
    if adm == "missed":
        return "missed"
    return "unknown"
