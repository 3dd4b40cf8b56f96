"""The administrator alert center: incidents with names, status and creators; acknowledge, snooze, recheck.

Only the application's configured administrator passes `_admin`; the center never reads prompts or
results and offers no schedule execution controls. The same three actions arrive from the pushed incident
cards (new, updated, reminder: `view="inc"`, answered with that incident card re-rendered in place) and from
digests (answered with the alert center).
"""
from __future__ import annotations

import sqlalchemy as sa

from bot.cards.actions import CardAction
from bot.cards.alert_center import render_alert_center
from bot.cards.alerts import render as render_notice
from bot.cards.views import AlertCenterView, IncidentItem
from bot.i18n import _

from hub.errors import AmuxError
from hub.store.tables import feishu_apps, incidents, outbox, principals, schedules

from .context import Answer, Ctx, Refused

PAGE = 5


ADMIN_ONLY = _("Only this application's administrator can use the alert center.")
RETIRED = _("This alert card was retired: the application's administrator changed, and the new administrator "
            "has the current card. Send /amux for your own view.")


def _admin(ctx: Ctx) -> None:
    if not ctx.viewer.is_admin:
        raise Refused(ADMIN_ONLY)


async def _admin_of_card(ctx: Ctx, a: CardAction) -> None:
    """Refuse anyone but the administrator; a former administrator pressing a card sent to them hears it was retired."""
    if ctx.viewer.is_admin:
        return
    if a.incident_id:
        async with ctx.hub.db.read() as conn:
            was_theirs = (await conn.execute(sa.select(outbox.c.id).where(
                outbox.c.incident_id == a.incident_id, outbox.c.app_id == ctx.viewer.app_id,
                outbox.c.recipient == ctx.viewer.open_id).limit(1))).first()
        if was_theirs is not None:
            raise Refused(RETIRED)
    raise Refused(ADMIN_ONLY)


async def _card(ctx: Ctx, page: int) -> dict:
    app_id = ctx.viewer.app_id
    async with ctx.hub.db.read() as conn:
        where = sa.and_(incidents.c.app_id == app_id, incidents.c.active_key.is_not(None))
        total = (await conn.execute(sa.select(sa.func.count()).select_from(incidents).where(where))).scalar() or 0
        pages = max(1, -(-total // PAGE))
        page = min(page, pages - 1)
        rows = (await conn.execute(
            sa.select(incidents, schedules.c.name.label("schedule_name"), principals.c.name.label("creator_name"))
            .outerjoin(schedules, schedules.c.id == incidents.c.schedule_id)
            .outerjoin(principals, principals.c.id == incidents.c.creator_id)
            .where(where).order_by(incidents.c.opened_at.desc(), incidents.c.id).offset(page * PAGE).limit(PAGE))).all()
        app = (await conn.execute(sa.select(feishu_apps).where(feishu_apps.c.app_id == app_id))).first()
    items = tuple(IncidentItem(r.id, r.schedule_name or r.schedule_id, r.creator_name, r.state, r.failures, r.missed,
                               r.unknowns, r.last_outcome, r.acked_at is not None,
                               r.snoozed_until.isoformat() if r.snoozed_until else None) for r in rows)
    diags: list[str] = []
    alerts = getattr(ctx.hub, "alerts", None)
    if alerts is not None:
        diags = [d.get("diagnostic") or d.get("state") or "" for d in await alerts.diagnostics() if d.get("app_id") == app_id]
    view = AlertCenterView(app_id, items, page, pages, app.delivery_state if app else "unconfigured",
                           tuple(d for d in diags if d))
    return render_alert_center(view, ctx.tr)


async def alert_center(ctx: Ctx, a: CardAction) -> Answer:
    """Show the active incidents of this application."""
    _admin(ctx)
    return Answer(card=await _card(ctx, a.page))


async def _incident(ctx: Ctx, incident_id: str) -> None:
    async with ctx.hub.db.read() as conn:
        ok = (await conn.execute(sa.select(incidents.c.id).where(incidents.c.id == incident_id,
                                                                 incidents.c.app_id == ctx.viewer.app_id))).first()
    if ok is None:
        raise Refused(_("This incident does not exist in this application."))


async def _refreshed(ctx: Ctx, a: CardAction, toast: str) -> Answer:
    """Answer with the card that was pressed, showing the new state: the incident card, else the alert center."""
    if a.view == "inc" and a.incident_id:
        view = await ctx.hub.alerts.card_view(a.incident_id)
        return Answer(card=render_notice(view), toast=toast)
    return Answer(card=await _card(ctx, a.page), toast=toast)


async def acknowledge(ctx: Ctx, a: CardAction) -> Answer:
    """Stop reminders of an incident (idempotent)."""
    await _admin_of_card(ctx, a)
    await _incident(ctx, a.incident_id)
    try:
        await ctx.hub.alerts.acknowledge(a.incident_id, by=ctx.viewer.open_id)
    except AmuxError:
        pass  # already closed or acknowledged: the card below shows the current state
    return await _refreshed(ctx, a, _("Acknowledged"))


async def snooze(ctx: Ctx, a: CardAction) -> Answer:
    """Hold reminders for 24 hours."""
    await _admin_of_card(ctx, a)
    await _incident(ctx, a.incident_id)
    try:
        await ctx.hub.alerts.snooze(a.incident_id)
    except AmuxError:
        pass
    return await _refreshed(ctx, a, _("Snoozed for 24 hours"))


async def recheck(ctx: Ctx, a: CardAction) -> Answer:
    """Lift a delivery suspension of this application and retry held notices now."""
    await _admin_of_card(ctx, a)
    if a.incident_id:
        await _incident(ctx, a.incident_id)
    await ctx.hub.alerts.recheck(ctx.viewer.app_id)
    return await _refreshed(ctx, a, _("Delivery rechecked"))
