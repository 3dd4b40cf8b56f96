"""Personal schedules: list, detail, history, results and the pause / resume / delete controls.

Every read and action goes through ScheduleService with the operator's own Caller, which applies the hub's one
schedule policy (frozen creator, application scope, active binding; `scope.owned` turns its refusal into this
bot's answer). Controls are idempotent: pausing a paused schedule or deleting a deleted one answers the same card.
"""
from __future__ import annotations

import secrets
from datetime import datetime

from bot.cards.actions import (Delete, Detail, EditForm, History, NewForm, Notify, Pause, Results, Resume,
                              RunNow, Save, Schedules)
from bot.cards.schedule_form import DEFAULT_PROFILE, FIELDS, FormView, field_of, render_form, rule_of, when_of
from bot.cards.schedules import (NOTIFY_MODES, render_deleted, render_detail, render_history, render_list,
                                 render_results, split_result)
from bot.cards.views import HistoryView, Outcome, ResultsView, ScheduleDetailView, ScheduleItem, ScheduleListView
from bot.i18n import _

from hub.services.schedules.views import FiringLine, firing_state
from hub.errors import Invalid
from hub.services.chat.bot import INBOUND_TTL
from hub.services.schedules.service import ScheduleSpec
from hub.services.views import ScheduleView

from .context import Answer, Ctx, Refused, handles
from .scope import owned, yours

LINK_FIRST = _("This Feishu identity is not linked to amux: send `/amux link CODE` with a code from "
               "`amux identity link` first.")
PAGE = 5
HISTORY_PAGE = 10


def _iso(dt: datetime | None) -> str | None:
    return dt.isoformat() if dt else None


def _outcome(f: FiringLine) -> Outcome:
    return Outcome(f.schedule_name, _iso(f.nominal_time), f.state, f.firing_id)


@handles(Schedules)
async def list_schedules(ctx: Ctx, a: Schedules) -> Answer:
    """Show one page of the viewer's own schedules."""
    p = await ctx.services.schedules.page(ctx.viewer.caller(), a.page, PAGE)
    items = tuple(ScheduleItem(schedule_id=i.schedule_id, name=i.name, rule=i.rule, paused=i.paused,
                               next_fire_at=_iso(i.next_fire_at), last=i.last_state, timezone=i.timezone)
                  for i in p.items)
    return Answer(card=render_list(ScheduleListView(items, p.page, p.pages, p.total), ctx.tr))


async def _detail_card(ctx: Ctx, schedule_id: str, notice: str | None = None) -> dict:
    s = await owned(ctx, schedule_id, recent=5)
    view = ScheduleDetailView(schedule_id=s.schedule_id, name=s.name, rule=s.rule, timezone=s.timezone,
                              schedule_type=s.schedule_type, paused=s.paused,
                              next_fire_at=_iso(s.next_fire_at), recent=tuple(_outcome(f) for f in s.recent),
                              notice=notice, notify=s.notify, overlap=s.overlap)
    return render_detail(view, ctx.tr)


@handles(Detail)
async def detail(ctx: Ctx, a: Detail) -> Answer:
    """Show one schedule: rule, next fire, last outcomes and controls."""
    return Answer(card=await _detail_card(ctx, a.schedule_id))


@handles(History)
async def history(ctx: Ctx, a: History) -> Answer:
    """Show one page of a schedule's firings (through ScheduleService.history, creator-checked again)."""
    s = await owned(ctx, a.schedule_id)
    h = await ctx.services.schedules.history(ctx.viewer.caller(), s.schedule_id, cursor=a.page * HISTORY_PAGE,
                                        limit=HISTORY_PAGE)
    items = tuple(Outcome(s.name, f["nominal_time"], firing_state(f["outcome"], f["admission"]), f["firing_id"])
                  for f in h["firings"])
    return Answer(card=render_history(HistoryView(schedule_id=s.schedule_id, name=s.name, firings=items, page=a.page,
                                                  has_more=h["next_cursor"] is not None, timezone=s.timezone),
                                      ctx.tr))


@handles(Results)
async def results(ctx: Ctx, a: Results) -> Answer:
    """Show one part of one firing's Task result, and its outcome and error when it did not succeed; long results
    are split across parts under 30 KB."""
    with yours():
        r = await ctx.services.results.page(ctx.viewer.caller(), a.schedule_id, a.page)
    if not r.pages or r.firing is None:
        return Answer(card=render_results(ResultsView(schedule_id=r.schedule_id, name=r.name, page=0, pages=0, part=0,
                                                      parts=0, timezone=r.timezone), ctx.tr))
    parts = split_result(r.text)
    part = min(a.sub, len(parts) - 1)
    view = ResultsView(schedule_id=r.schedule_id, name=r.name, page=r.page, pages=r.pages, part=part, parts=len(parts),
                       firing=_outcome(r.firing), text=parts[part], error=r.error, timezone=r.timezone,
                       task_id=r.task_id)
    return Answer(card=render_results(view, ctx.tr))


@handles(Pause)
async def pause(ctx: Ctx, a: Pause) -> Answer:
    """Pause future dispatch (idempotent)."""
    s = await owned(ctx, a.schedule_id)
    if not s.paused:
        await ctx.services.schedules.pause(ctx.viewer.caller(), s.schedule_id)
    return Answer(card=await _detail_card(ctx, s.schedule_id, _("Paused: no new runs until you resume.")),
                  toast=_("Schedule paused"))


@handles(Resume)
async def resume(ctx: Ctx, a: Resume) -> Answer:
    """Resume dispatch from the next future fire time (idempotent)."""
    s = await owned(ctx, a.schedule_id)
    if s.paused:
        await ctx.services.schedules.resume(ctx.viewer.caller(), s.schedule_id)
    return Answer(card=await _detail_card(ctx, s.schedule_id, _("Resumed.")), toast=_("Schedule resumed"))


@handles(Notify)
async def notify(ctx: Ctx, a: Notify) -> Answer:
    """Set which outcomes reach the administrator (failures | all | none; idempotent), through ScheduleService."""
    if a.sub >= len(NOTIFY_MODES):
        raise Refused(_("This button is out of date; send /amux for a fresh card."))
    mode = NOTIFY_MODES[a.sub]
    s = await owned(ctx, a.schedule_id)
    if s.notify != mode:
        await ctx.services.schedules.update(ctx.viewer.caller(), s.schedule_id, ScheduleSpec(notify=mode))
    return Answer(card=await _detail_card(ctx, s.schedule_id), toast=_("Notifications updated"))


@handles(Delete)
async def delete(ctx: Ctx, a: Delete) -> Answer:
    """Delete the schedule (idempotent: a second press answers the same card)."""
    s = await owned(ctx, a.schedule_id, include_deleted=True)
    if not s.deleted:
        await ctx.services.schedules.delete(ctx.viewer.caller(), s.schedule_id)
    return Answer(card=render_deleted(s.name, ctx.tr), toast=_("Schedule deleted"))


# ------------------------------------------------------------ the schedule form

def _nonce() -> str:
    return "f" + secrets.token_hex(8)


def _timezone(ctx: Ctx) -> str:
    """The viewer's application's timezone (the form's default)."""
    for app in ctx.services.feishu.apps:
        if app.app_id == ctx.viewer.app_id:
            return app.timezone
    return ctx.services.schedules.settings.default_timezone


async def _form(ctx: Ctx, schedule_id: str | None, values: dict[str, str], error: str | None = None,
                detail: str = "") -> dict:
    profiles = await ctx.services.schedules.usable_profiles(ctx.viewer.caller())
    return render_form(FormView(nonce=_nonce(), schedule_id=schedule_id, values=values, profiles=tuple(profiles),
                                default_timezone=_timezone(ctx), error_field=error, error_detail=detail), ctx.tr)


@handles(NewForm)
async def new_form(ctx: Ctx, a: NewForm) -> Answer:
    """Open the New schedule form (blank; the timezone defaults to the application's)."""
    return Answer(card=await _form(ctx, None, {}))


@handles(EditForm)
async def edit_form(ctx: Ctx, a: EditForm) -> Answer:
    """Open the same form filled in with the viewer's schedule."""
    with yours():
        s = await ctx.services.schedules.get(ctx.viewer.caller(), a.schedule_id)
    return Answer(card=await _form(ctx, s.schedule_id, _values_of(s)))


def _values_of(s: ScheduleView) -> dict[str, str]:
    return {"name": s.name or "", "prompt": s.prompt or "", "when": when_of(s.rule),
            "timezone": s.timezone, "profile": s.profile or DEFAULT_PROFILE, "notify": s.notify}


def _submitted(form: dict | None) -> dict[str, str]:
    """The form_value of a submission, each field a string (a missing or foreign field is empty)."""
    form = form if isinstance(form, dict) else {}
    return {k: form[k].strip() if isinstance(form.get(k), str) else "" for k in FIELDS}


@handles(Save)
async def save(ctx: Ctx, a: Save) -> Answer:
    """Create or change a schedule from a form submission, through ScheduleService's own validation (the same
    defaults, refusals and minimum interval as MCP `schedule_create` / `schedule_update`). A refusal renders the
    form again, filled in, naming the field and its fix; nothing is stored. Each rendering of the form saves once."""
    vals = _submitted(ctx.form)
    caller = ctx.viewer.caller()
    if a.schedule_id:  # the edit must be of the viewer's own schedule before anything is read from the form
        with yours():
            current = await ctx.services.schedules.get(caller, a.schedule_id)
    if not await ctx.services.state.first_seen(ctx.viewer.app_id, f"form:{a.nonce}", INBOUND_TTL):
        return Answer(toast=_("This form was already submitted; nothing more was saved."), toast_kind="info")
    profiles = await ctx.services.schedules.usable_profiles(caller)
    profile = vals["profile"] or DEFAULT_PROFILE
    if profile != DEFAULT_PROFILE and profile not in profiles:
        return Answer(card=await _form(ctx, a.schedule_id, vals, "profile", f"profile {profile!r} is not offered"),
                      toast=_("Not saved"), toast_kind="error")
    spec = ScheduleSpec(name=vals["name"] or None, prompt=vals["prompt"], rule=rule_of(vals["when"]),
                        timezone=vals["timezone"] or None, notify=vals["notify"] or None,
                        profile=None if profile == DEFAULT_PROFILE else profile)
    try:
        if a.schedule_id:
            was = _values_of(current)
            changed = ScheduleSpec(**{k: getattr(spec, k) for k in ("name", "prompt", "timezone", "notify")
                                      if vals[k] and vals[k] != was[k]})
            if rule_of(vals["when"]) != rule_of(was["when"]) or vals["timezone"] != was["timezone"]:
                changed.rule = spec.rule
            if profile != was["profile"]:
                changed.profile = "" if profile == DEFAULT_PROFILE else profile
            if not vals["prompt"]:
                changed.prompt = ""
            if any(getattr(changed, f) is not None for f in ("name", "prompt", "rule", "timezone", "notify",
                                                               "profile")):
                await ctx.services.schedules.update(caller, a.schedule_id, changed)
            sid = a.schedule_id
        else:
            created = await ctx.services.schedules.create(caller, spec, source="feishu-card",
                                                          card_receipt={**(ctx.receipt or {}),
                                                                        "binding_id": ctx.viewer.binding_id,
                                                                        "app_id": ctx.viewer.app_id,
                                                                        "open_id": ctx.viewer.open_id})
            sid = created.schedule_id
    except Invalid as e:
        if "/amux link" in e.message:
            raise Refused(LINK_FIRST) from None
        return Answer(card=await _form(ctx, a.schedule_id, vals, field_of(e.message), e.message),
                      toast=_("Not saved"), toast_kind="error")
    return Answer(card=await _detail_card(ctx, sid, _("Saved. The next run is shown below.")),
                  toast=_("Schedule saved"))


@handles(RunNow)
async def run_now(ctx: Ctx, a: RunNow) -> Answer:
    """Fire the viewer's schedule once, now (a manual firing; the rule's next fire time stays)."""
    s = await owned(ctx, a.schedule_id)
    with yours():
        await ctx.services.schedules.run_now(ctx.viewer.caller(), s.schedule_id)
    return Answer(card=await _detail_card(ctx, s.schedule_id, _("Started one run now; its outcome shows in the "
                                                                 "history. The next scheduled run is unchanged.")),
                  toast=_("Run started"))
