"""Personal views use the hub's one schedule policy (hub/services/schedules/access.py, applied by ScheduleService);
no rules of their own."""
from __future__ import annotations

import contextlib
from typing import Iterator

from bot.i18n import _

from hub.errors import NotFound
from hub.services.schedules.views import ScheduleCard

from .context import Ctx, Refused

NOT_YOURS = _("This schedule does not exist or is not yours.")


@contextlib.contextmanager
def yours() -> Iterator[None]:
    """Answer the service's "not yours" refusal as this bot's (the same whether absent or someone else's)."""
    try:
        yield
    except NotFound:
        raise Refused(NOT_YOURS) from None


async def owned(ctx: Ctx, schedule_id: str, *, include_deleted: bool = False, recent: int = 0) -> ScheduleCard:
    """Return the viewer's schedule with its `recent` latest firings, or refuse."""
    with yours():
        return await ctx.services.schedules.card(ctx.viewer.caller(), schedule_id, include_deleted=include_deleted,
                                            recent=recent)
