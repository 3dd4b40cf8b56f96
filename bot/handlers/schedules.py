"""Personal schedules: list, detail, history, results and the pause / resume / delete controls.

Every read and action goes through ScheduleService with the operator's own Caller, which applies the hub's one
schedule policy (frozen creator, application scope, active binding; `scope.owned` turns its refusal into this
bot's answer). Controls are idempotent: pausing a paused schedule or deleting a deleted one answers the same card.
"""
from __future__ import annotations

from datetime import datetime

from bot.cards.actions import CardAction
from bot.cards.schedules import (NOTIFY_MODES, render_deleted, render_detail, render_history, render_list,
                                 render_results, split_result)
from bot.cards.views import HistoryView, Outcome, ResultsView, ScheduleDetailView, ScheduleItem, ScheduleListView
from bot.i18n import _

from hub.services.schedule_views import FiringLine, firing_state
from hub.services.schedules import ScheduleSpec

from .context import Answer, Ctx, Refused
from .scope import owned, yours

PAGE = 5
HISTORY_PAGE = 10


def _iso(dt: datetime | None) -> str | None:
    return dt.isoformat() if dt else None


def _outcome(f: FiringLine) -> Outcome:
    return Outcome(f.schedule_name, _iso(f.nominal_time), f.state, f.firing_id)


async def list_schedules(ctx: Ctx, a: CardAction) -> Answer:
    """Show one page of the viewer's own schedules."""
    p = await ctx.services.schedules.page(ctx.viewer.caller(), a.page, PAGE)
    items = tuple(ScheduleItem(schedule_id=i.schedule_id, name=i.name, rule=i.rule, paused=i.paused,
                               next_fire_at=_iso(i.next_fire_at), last=i.last_state)
                  for i in p.items)
    return Answer(card=render_list(ScheduleListView(items, p.page, p.pages, p.total), ctx.tr))


async def _detail_card(ctx: Ctx, schedule_id: str, notice: str | None = None) -> dict:
    s = await owned(ctx, schedule_id, recent=5)
    view = ScheduleDetailView(schedule_id=s.schedule_id, name=s.name, rule=s.rule, timezone=s.timezone,
                              schedule_type=s.schedule_type, paused=s.paused,
                              next_fire_at=_iso(s.next_fire_at), recent=tuple(_outcome(f) for f in s.recent),
                              notice=notice, notify=s.notify, overlap=s.overlap)
    return render_detail(view, ctx.tr)


async def detail(ctx: Ctx, a: CardAction) -> Answer:
    """Show one schedule: rule, next fire, last outcomes and controls."""
    return Answer(card=await _detail_card(ctx, a.schedule_id))


async def history(ctx: Ctx, a: CardAction) -> Answer:
    """Show one page of a schedule's firings (through ScheduleService.history, creator-checked again)."""
    s = await owned(ctx, a.schedule_id)
    h = await ctx.services.schedules.history(ctx.viewer.caller(), s.schedule_id, cursor=a.page * HISTORY_PAGE,
                                        limit=HISTORY_PAGE)
    items = tuple(Outcome(s.name, f["nominal_time"], firing_state(f["outcome"], f["admission"]), f["firing_id"])
                  for f in h["firings"])
    return Answer(card=render_history(HistoryView(schedule_id=s.schedule_id, name=s.name, firings=items, page=a.page,
                                                  has_more=h["next_cursor"] is not None),
                                      ctx.tr))


async def results(ctx: Ctx, a: CardAction) -> Answer:
    """Show one part of one firing's Task result, and its outcome and error when it did not succeed; long results
    are split across parts under 30 KB."""
    with yours():
        r = await ctx.services.results.page(ctx.viewer.caller(), a.schedule_id, a.page)
    if not r.pages or r.firing is None:
        return Answer(card=render_results(ResultsView(schedule_id=r.schedule_id, name=r.name, page=0, pages=0, part=0,
                                                      parts=0), ctx.tr))
    parts = split_result(r.text)
    part = min(a.sub, len(parts) - 1)
    view = ResultsView(schedule_id=r.schedule_id, name=r.name, page=r.page, pages=r.pages, part=part, parts=len(parts),
                       firing=_outcome(r.firing), text=parts[part], error=r.error)
    return Answer(card=render_results(view, ctx.tr))


async def pause(ctx: Ctx, a: CardAction) -> Answer:
    """Pause future dispatch (idempotent)."""
    s = await owned(ctx, a.schedule_id)
    if not s.paused:
        await ctx.services.schedules.pause(ctx.viewer.caller(), s.schedule_id)
    return Answer(card=await _detail_card(ctx, s.schedule_id, _("Paused: no new runs until you resume.")),
                  toast=_("Schedule paused"))


async def resume(ctx: Ctx, a: CardAction) -> Answer:
    """Resume dispatch from the next future fire time (idempotent)."""
    s = await owned(ctx, a.schedule_id)
    if s.paused:
        await ctx.services.schedules.resume(ctx.viewer.caller(), s.schedule_id)
    return Answer(card=await _detail_card(ctx, s.schedule_id, _("Resumed.")), toast=_("Schedule resumed"))


async def notify(ctx: Ctx, a: CardAction) -> Answer:
    """Set which outcomes reach the administrator (failures | all | none; idempotent), through ScheduleService."""
    if a.sub >= len(NOTIFY_MODES):
        raise Refused(_("This button is out of date; send /amux for a fresh card."))
    mode = NOTIFY_MODES[a.sub]
    s = await owned(ctx, a.schedule_id)
    if s.notify != mode:
        await ctx.services.schedules.update(ctx.viewer.caller(), s.schedule_id, ScheduleSpec(notify=mode))
    return Answer(card=await _detail_card(ctx, s.schedule_id), toast=_("Notifications updated"))


async def delete(ctx: Ctx, a: CardAction) -> Answer:
    """Delete the schedule (idempotent: a second press answers the same card)."""
    s = await owned(ctx, a.schedule_id, include_deleted=True)
    if not s.deleted:
        await ctx.services.schedules.delete(ctx.viewer.caller(), s.schedule_id)
    return Answer(card=render_deleted(s.name, ctx.tr), toast=_("Schedule deleted"))
