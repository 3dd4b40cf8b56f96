"""`/amux` and the back button: the personal summary, refreshed on every visit."""
from __future__ import annotations

from bot.cards.actions import Overview
from bot.cards.overview import render_overview
from bot.cards.views import Outcome, OverviewView

from .context import Answer, Ctx, handles


@handles(Overview)
async def overview(ctx: Ctx, _action: Overview | None = None) -> Answer:
    """Render the viewer's summary: their schedules, failing and paused counts, latest outcomes."""
    v = ctx.viewer
    s = await ctx.services.schedules.summary(v.caller(), incidents_of=v.app_id if v.is_admin else None)
    latest = tuple(Outcome(f.schedule_name, f.nominal_time.isoformat() if f.nominal_time else None, f.state,
                           f.firing_id) for f in s.latest)
    view = OverviewView(viewer=v.name.rsplit(":", 1)[-1], total=s.total, failing=s.failing, paused=s.paused,
                        latest=latest, is_admin=v.is_admin, active_incidents=s.active_incidents)
    return Answer(card=render_overview(view, ctx.tr))
