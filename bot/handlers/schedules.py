"""Personal schedules: list, detail, history, results and the pause / resume / delete controls.

Every read and action goes through `scope.owned` (frozen creator, application scope, active binding)
and then through ScheduleService with the operator's own Caller (execution access as for the CLI).
Controls are idempotent: pausing a paused schedule or deleting a deleted one answers the same card.
"""
from __future__ import annotations

import sqlalchemy as sa

from bot.cards.actions import CardAction
from bot.cards.schedules import (NOTIFY_MODES, render_deleted, render_detail, render_history, render_list,
                                 render_results, split_result)
from bot.cards.views import HistoryView, Outcome, ResultsView, ScheduleDetailView, ScheduleItem, ScheduleListView
from bot.i18n import _

from hub.services.schedules import ScheduleSpec
from hub.store.tables import firings, schedules, task_runs

from .context import Answer, Ctx, Refused
from .scope import firing_state, owned, owned_filter

PAGE = 5
HISTORY_PAGE = 10


def _iso(dt) -> str | None:  # noqa: ANN001
    return dt.isoformat() if dt else None


def _outcome(name: str, f) -> Outcome:  # noqa: ANN001
    return Outcome(name, _iso(f.nominal_time), firing_state(f), f.id)


async def list_schedules(ctx: Ctx, a: CardAction) -> Answer:
    """Show one page of the viewer's own schedules."""
    async with ctx.hub.db.read() as conn:
        where = owned_filter(ctx.viewer)
        total = (await conn.execute(sa.select(sa.func.count()).select_from(schedules).where(where))).scalar() or 0
        pages = max(1, -(-total // PAGE))
        page = min(a.page, pages - 1)
        rows = (await conn.execute(sa.select(schedules).where(where).order_by(schedules.c.created_at.desc(), schedules.c.id)
                                   .offset(page * PAGE).limit(PAGE))).all()
        items = []
        for r in rows:
            last = (await conn.execute(sa.select(firings).where(firings.c.schedule_id == r.id)
                                       .order_by(firings.c.nominal_time.desc()).limit(1))).first()
            items.append(ScheduleItem(r.id, r.name, r.rule, r.paused, _iso(r.next_fire_at),
                                      firing_state(last) if last else None))
    return Answer(card=render_list(ScheduleListView(tuple(items), page, pages, total), ctx.tr))


async def _detail_card(ctx: Ctx, schedule_id: str, notice: str | None = None) -> dict:
    async with ctx.hub.db.read() as conn:
        row = await owned(conn, ctx.viewer, schedule_id)
        recent = (await conn.execute(sa.select(firings).where(firings.c.schedule_id == row.id)
                                     .order_by(firings.c.nominal_time.desc()).limit(5))).all()
    view = ScheduleDetailView(row.id, row.name, row.rule, row.timezone, row.type, row.paused, _iso(row.next_fire_at),
                              tuple(_outcome(row.name, f) for f in recent), notice, row.notify)
    return render_detail(view, ctx.tr)


async def detail(ctx: Ctx, a: CardAction) -> Answer:
    """Show one schedule: rule, next fire, last outcomes and controls."""
    return Answer(card=await _detail_card(ctx, a.schedule_id))


async def history(ctx: Ctx, a: CardAction) -> Answer:
    """Show one page of a schedule's firings (through ScheduleService.history, creator-checked again)."""
    async with ctx.hub.db.read() as conn:
        row = await owned(conn, ctx.viewer, a.schedule_id)
    h = await ctx.hub.schedules.history(ctx.viewer.caller(), row.id, cursor=a.page * HISTORY_PAGE, limit=HISTORY_PAGE)
    items = tuple(Outcome(row.name, f["nominal_time"], _state(f), f["firing_id"]) for f in h["firings"])
    return Answer(card=render_history(HistoryView(row.id, row.name, items, a.page, h["next_cursor"] is not None), ctx.tr))


def _state(f: dict) -> str:
    class _F:  # firing_state reads attributes
        outcome, admission = f["outcome"], f["admission"]
    return firing_state(_F)


async def results(ctx: Ctx, a: CardAction) -> Answer:
    """Show one part of one firing's Task result; long results are split across parts under 30 KB."""
    async with ctx.hub.db.read() as conn:
        row = await owned(conn, ctx.viewer, a.schedule_id)
        with_task = sa.select(firings).where(firings.c.schedule_id == row.id, firings.c.task_id.is_not(None))
        pages = (await conn.execute(sa.select(sa.func.count()).select_from(with_task.subquery()))).scalar() or 0
        if not pages:
            return Answer(card=render_results(ResultsView(row.id, row.name, 0, 0, 0, 0), ctx.tr))
        page = min(a.page, pages - 1)
        f = (await conn.execute(with_task.order_by(firings.c.nominal_time.desc()).offset(page).limit(1))).first()
        # The Task was admitted for this schedule's frozen creator, who is the viewer (checked above).
        text = (await conn.execute(sa.select(task_runs.c.result_text).where(task_runs.c.id == f.task_id))).scalar()
    parts = split_result(text or "")
    part = min(a.sub, len(parts) - 1)
    view = ResultsView(row.id, row.name, page, pages, part, len(parts), _outcome(row.name, f), parts[part])
    return Answer(card=render_results(view, ctx.tr))


async def pause(ctx: Ctx, a: CardAction) -> Answer:
    """Pause future dispatch (idempotent)."""
    async with ctx.hub.db.read() as conn:
        row = await owned(conn, ctx.viewer, a.schedule_id)
    if not row.paused:
        await ctx.hub.schedules.pause(ctx.viewer.caller(), row.id)
    return Answer(card=await _detail_card(ctx, row.id, _("Paused: no new runs until you resume.")),
                  toast=_("Schedule paused"))


async def resume(ctx: Ctx, a: CardAction) -> Answer:
    """Resume dispatch from the next future fire time (idempotent)."""
    async with ctx.hub.db.read() as conn:
        row = await owned(conn, ctx.viewer, a.schedule_id)
    if row.paused:
        await ctx.hub.schedules.resume(ctx.viewer.caller(), row.id)
    return Answer(card=await _detail_card(ctx, row.id, _("Resumed.")), toast=_("Schedule resumed"))


async def notify(ctx: Ctx, a: CardAction) -> Answer:
    """Set which outcomes reach the administrator (failures | all | none; idempotent), through ScheduleService."""
    if a.sub >= len(NOTIFY_MODES):
        raise Refused(_("This button is out of date; send /amux for a fresh card."))
    mode = NOTIFY_MODES[a.sub]
    async with ctx.hub.db.read() as conn:
        row = await owned(conn, ctx.viewer, a.schedule_id)
    if row.notify != mode:
        await ctx.hub.schedules.update(ctx.viewer.caller(), row.id, ScheduleSpec(notify=mode))
    return Answer(card=await _detail_card(ctx, row.id), toast=_("Notifications updated"))


async def delete(ctx: Ctx, a: CardAction) -> Answer:
    """Delete the schedule (idempotent: a second press answers the same card)."""
    async with ctx.hub.db.read() as conn:
        row = await owned(conn, ctx.viewer, a.schedule_id, include_deleted=True)
    if row.deleted_at is None:
        await ctx.hub.schedules.delete(ctx.viewer.caller(), row.id)
    return Answer(card=render_deleted(row.name, ctx.tr), toast=_("Schedule deleted"))
