"""`/amux` and the back button: the personal summary, refreshed on every visit."""
from __future__ import annotations

from bot.cards.actions import Overview
from bot.cards.overview import render_overview
from bot.cards.views import Outcome, OverviewView

from .alert_center import app_timezone
from .context import Answer, Ctx, handles


async def greeting_name(ctx: Ctx) -> str:
    """The name to greet the viewer by: the one Feishu gives (contact lookup), else the principal's own name when a
    person chose it (a linked account), else none (never an open_id)."""
    v = ctx.viewer
    directory = ctx.services.directory
    name = await directory.name(v.app_id, v.open_id) if directory is not None else None
    if name:
        return name
    return "" if v.name.startswith("feishu:") else v.name


@handles(Overview)
async def overview(ctx: Ctx, _action: Overview | None = None) -> Answer:
    """Render the viewer's summary: their schedules, failing and paused counts, latest outcomes."""
    v = ctx.viewer
    s = await ctx.services.schedules.summary(v.caller(), incidents_of=v.app_id if v.is_admin else None)
    latest = tuple(Outcome(f.schedule_name, f.nominal_time.isoformat() if f.nominal_time else None, f.state,
                           f.firing_id) for f in s.latest)
    view = OverviewView(viewer=await greeting_name(ctx), total=s.total, failing=s.failing, paused=s.paused,
                        latest=latest, is_admin=v.is_admin, active_incidents=s.active_incidents,
                        timezone=app_timezone(ctx))
    return Answer(card=render_overview(view, ctx.tr))
