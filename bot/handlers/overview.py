"""`/amux` and the back button: the personal summary, refreshed on every visit."""
from __future__ import annotations

import sqlalchemy as sa

from bot.cards.overview import render_overview
from bot.cards.views import Outcome, OverviewView

from hub.store.tables import firings, incidents, schedules

from .context import Answer, Ctx
from .scope import firing_state, owned_filter

FAILING = ("failed", "timed_out", "missed", "error", "cancelled")


async def overview(ctx: Ctx, _action=None) -> Answer:  # noqa: ANN001
    """Render the viewer's summary: their schedules, failing and paused counts, latest outcomes."""
    v = ctx.viewer
    async with ctx.hub.db.read() as conn:
        rows = (await conn.execute(sa.select(schedules.c.id, schedules.c.name, schedules.c.paused)
                                   .where(owned_filter(v)))).all()
        names = {r.id: r.name for r in rows}
        latest, failing = [], 0
        if names:
            recent = (await conn.execute(sa.select(firings).where(firings.c.schedule_id.in_(list(names)))
                                         .order_by(firings.c.nominal_time.desc()).limit(200))).all()
            seen: set[str] = set()
            for f in recent:
                state = firing_state(f)
                if f.schedule_id not in seen:
                    seen.add(f.schedule_id)
                    failing += state in FAILING
                if len(latest) < 5:
                    latest.append(Outcome(names[f.schedule_id], f.nominal_time.isoformat() if f.nominal_time else None,
                                          state, f.id))
        active = 0
        if v.is_admin:
            active = (await conn.execute(sa.select(sa.func.count()).select_from(incidents).where(
                incidents.c.app_id == v.app_id, incidents.c.active_key.is_not(None)))).scalar() or 0
    view = OverviewView(viewer=v.name.rsplit(":", 1)[-1], total=len(rows), failing=failing,
                        paused=sum(1 for r in rows if r.paused), latest=tuple(latest), is_admin=v.is_admin,
                        active_incidents=active)
    return Answer(card=render_overview(view, ctx.tr))
