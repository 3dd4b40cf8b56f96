"""Personal views use the hub's one schedule policy (hub/services/schedule_access.py); no rules of their own."""
from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from bot.i18n import _
from bot.identity import Viewer

from hub.services.schedule_access import visible
from hub.store.tables import schedules

from .context import Refused

NOT_YOURS = _("This schedule does not exist or is not yours.")


def owned_filter(v: Viewer, include_deleted: bool = False) -> Any:
    """Return the WHERE clause of schedules the viewer may see: the hub's one policy (`schedule_access.visible`)."""
    return visible(v.caller(), include_deleted=include_deleted)


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
