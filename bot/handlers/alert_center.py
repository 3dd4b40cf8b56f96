"""The administrator alert center: incidents with names, status and creators; acknowledge, snooze, recheck.

Only the application's configured administrator passes `_admin`; the center never reads prompts or
results and offers no schedule execution controls. The same three actions arrive from the pushed incident
cards (new, updated, reminder: `view="inc"`, answered with that incident card re-rendered in place) and from
digests (answered with the alert center).
"""
from __future__ import annotations

import re

from bot.cards.actions import Ack, Alerts, OnIncident, Recheck, Snooze
from bot.cards.alert_center import DELIVERY, render_alert_center
from bot.cards.alerts import duration
from bot.cards.alerts import render as render_notice
from bot.cards.base import APP_TIMEZONE
from bot.cards.views import AlertCenterView, Diagnostic, IncidentItem
from bot.i18n import _
from hub.errors import AmuxError

from .context import Answer, Ctx, Refused, handles

PAGE = 5
FEISHU_CODE = re.compile(r"(?:^|\()(\d{4,})\b")   # "230013: …" (a notice's last error) or "(230013: …)" (an app's)


ADMIN_ONLY = _("Only this application's administrator can use the alert center.")
RETIRED = _("This alert card was retired: the application's administrator changed, and the new administrator "
            "has the current card. Send /amux for your own view.")


def _admin(ctx: Ctx) -> None:
    if not ctx.viewer.is_admin:
        raise Refused(ADMIN_ONLY)


async def _admin_of_card(ctx: Ctx, a: OnIncident) -> None:
    """Refuse anyone but the administrator; a former administrator pressing a card sent to them hears it was retired."""
    if ctx.viewer.is_admin:
        return
    if a.target and await ctx.services.alerts.was_sent_to(a.target, ctx.viewer.app_id, ctx.viewer.open_id):
        raise Refused(RETIRED)
    raise Refused(ADMIN_ONLY)


def app_timezone(ctx: Ctx) -> str:
    """The viewer's application's timezone (Asia/Shanghai when its settings name none)."""
    for app in ctx.services.feishu.apps:
        if app.app_id == ctx.viewer.app_id:
            return app.timezone or APP_TIMEZONE
    return APP_TIMEZONE


def snooze_s(ctx: Ctx) -> float:
    """`alerts.snooze_s`: how long the Snooze button holds reminders."""
    return float(ctx.services.alerts.n.snooze_s)


def diagnostic(d: dict) -> Diagnostic:
    """The facts of one `AlertService.diagnostics()` entry (the card words them from the catalog)."""
    code = FEISHU_CODE.search(d.get("diagnostic") or "")
    if "notice_id" in d:
        return Diagnostic(state=d.get("state") or "", notice_kind=d.get("kind") or "", code=code[1] if code else "")
    return Diagnostic(state=d.get("delivery_state") or "", code=code[1] if code else "")


async def _card(ctx: Ctx, page: int) -> dict:
    center = await ctx.services.alerts.center(ctx.viewer.app_id, page, PAGE)
    items = tuple(IncidentItem(incident_id=r.id, schedule_name=r.schedule_name or r.schedule_id, creator=r.creator_name,
                               state=r.state, failures=r.failures, missed=r.missed, unknowns=r.unknowns,
                               last_outcome=r.last_outcome, acknowledged=r.acked_at is not None,
                               snoozed_until=r.snoozed_until.isoformat() if r.snoozed_until else None,
                               run_id=r.last_task_id or r.last_turn_id or "",
                               run_kind="task" if r.last_task_id else "turn")
                  for r in center.incidents)
    view = AlertCenterView(app_id=ctx.viewer.app_id, incidents=items, page=center.page, pages=center.pages,
                           delivery_state=center.delivery_state,
                           diagnostics=tuple(diagnostic(d) for d in center.diagnostics),
                           timezone=app_timezone(ctx), snooze_s=snooze_s(ctx))
    return render_alert_center(view, ctx.tr)


@handles(Alerts)
async def alert_center(ctx: Ctx, a: Alerts) -> Answer:
    """Show the active incidents of this application."""
    _admin(ctx)
    return Answer(card=await _card(ctx, a.page))


async def _incident(ctx: Ctx, incident_id: str) -> None:
    if not await ctx.services.alerts.in_app(incident_id, ctx.viewer.app_id):
        raise Refused(_("This incident does not exist in this application."))


async def _refreshed(ctx: Ctx, a: OnIncident, toast: str, values: tuple = ()) -> Answer:
    """Answer with the card that was pressed, showing the new state: the incident card, else the alert center."""
    if a.view == "inc" and a.target:
        view = await ctx.services.alerts.card_view(a.target)
        return Answer(card=render_notice(view, ctx.tr), toast=toast, toast_values=values)
    return Answer(card=await _card(ctx, a.page), toast=toast, toast_values=values)


@handles(Ack)
async def acknowledge(ctx: Ctx, a: Ack) -> Answer:
    """Stop reminders of an incident (idempotent)."""
    await _admin_of_card(ctx, a)
    await _incident(ctx, a.incident_id)
    try:
        await ctx.services.alerts.acknowledge(a.incident_id, by=ctx.viewer.open_id)
    except AmuxError:
        pass  # already closed or acknowledged: the card below shows the current state
    return await _refreshed(ctx, a, _("Acknowledged"))


@handles(Snooze)
async def snooze(ctx: Ctx, a: Snooze) -> Answer:
    """Hold reminders for `alerts.snooze_s`."""
    await _admin_of_card(ctx, a)
    await _incident(ctx, a.incident_id)
    try:
        await ctx.services.alerts.snooze(a.incident_id)
    except AmuxError:
        pass
    return await _refreshed(ctx, a, _("Snoozed for {duration}"),
                            (("duration", duration(ctx.tr, snooze_s(ctx))),))


@handles(Recheck)
async def recheck(ctx: Ctx, a: Recheck) -> Answer:
    """Lift a delivery suspension of this application and retry held notices now."""
    await _admin_of_card(ctx, a)
    if a.incident_id:
        await _incident(ctx, a.incident_id)
    try:
        res = await ctx.services.alerts.recheck(ctx.viewer.app_id)
    except AmuxError:
        raise Refused(_("This application is not configured on the hub: add it under [[feishu.apps]], then press "
                        "Recheck delivery again.")) from None
    state = ctx.tr.text(DELIVERY.get(res["delivery_state"], _("no administrator configured")))
    return await _refreshed(ctx, a, _("Delivery rechecked: {state}; {pending} held notices are due now."),
                            (("state", state), ("pending", res["pending"])))
