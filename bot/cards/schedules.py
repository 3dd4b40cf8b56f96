"""Personal schedule cards: list, detail, history and results (pure)."""
from __future__ import annotations

from typing import Any

from bot.i18n import Catalogs, _
from hub.services.schedules.views import UNSUCCESSFUL

from .actions import (CardAction, Delete, Detail, EditForm, History, NewForm, Notify, Overview, Pause, Results,
                      Resume, RunNow, Schedules)
from .base import button, button_row, card, check_limits, esc, hr, join, markdown, same, when
from .timeline import timeline_button
from .overview import outcome_line, outcome_text
from .views import HistoryView, ResultsView, ScheduleDetailView, ScheduleListView

RESULT_PART_BYTES = 9_000  # escaped result text per card part; the card stays far below 30 KB
ERROR_CHARS = 1_000        # of a failed run's error: three copies (content, en, zh) fit beside a result part


def _pager(tr: Catalogs, op: str, page: int, has_prev: bool, has_next: bool, **kw: Any) -> list[dict[str, Any]]:
    buttons = []
    if has_prev:
        buttons.append(button(tr.text(_("Previous")), CardAction.of(op, page=page - 1, **kw)))
    if has_next:
        buttons.append(button(tr.text(_("Next")), CardAction.of(op, page=page + 1, **kw)))
    return [button_row(*buttons)] if buttons else []


def _back(tr: Catalogs, *extra: dict[str, Any]) -> dict[str, Any]:
    return button_row(*extra, button(tr.text(_("Back to overview")), Overview()))


def render_list(v: ScheduleListView, tr: Catalogs) -> dict[str, Any]:
    """Render one page of the viewer's own schedules."""
    elements: list[dict[str, Any]] = []
    if not v.items:
        elements.append(markdown(tr.text(_("You have no schedules. Press New schedule to make one, or ask the agent "
                                           "in a chat."))))
    for it in v.items:
        state = (tr.text(_("paused")) if it.paused
                 else tr.text(_("next run {time}"), time=when(it.next_fire_at, it.timezone)))
        last = outcome_text(tr, it.last) if it.last else tr.text(_("no runs yet"))
        head = same(f"**{esc(it.name)}** · `{esc(it.rule)}`")
        elements.append(markdown(join(head, join(state, last, sep=" · "))))
        elements.append(button_row(button(tr.text(_("Open")), Detail(schedule_id=it.schedule_id))))
    elements.append(markdown(tr.text(_("Page {page} of {pages} · {total} schedules"),
                                     page=v.page + 1, pages=max(v.pages, 1), total=v.total)))
    elements += _pager(tr, "schedules", v.page, v.page > 0, v.page + 1 < v.pages)
    elements += [hr(), _back(tr, button(tr.text(_("New schedule")), NewForm(), "primary"))]
    return check_limits(card(tr.text(_("Personal schedules")), elements))


NOTIFY_MODES = ("failures", "all", "none")   # Notify(sub=index) picks one
NOTIFY_LABELS = {"failures": _("failures only"), "all": _("every run"), "none": _("off")}
OVERLAP_LABELS = {"allow": _("allowed (runs may overlap)"), "skip": _("skip while the previous run is unfinished"),
                  "replace": _("cancel the unfinished previous run and replace it")}
NOTIFY_BUTTONS = {"failures": _("Notify failures only"), "all": _("Notify every run"), "none": _("Notifications off")}


def render_detail(v: ScheduleDetailView, tr: Catalogs) -> dict[str, Any]:
    """Render one schedule with its controls."""
    status = tr.text(_("paused")) if v.paused else tr.text(_("active"))
    lines = [
        same(f"**{esc(v.name)}** (`{v.schedule_id}`)"),
        tr.text(_("**Rule**: {rule} ({tz})"), rule=esc(v.rule), tz=esc(v.timezone)),
        tr.text(_("**Status**: {status}"), status=""),
        tr.text(_("**Next run**: {time}"), time=when(v.next_fire_at, v.timezone) if not v.paused else "—"),
    ]
    lines[2] = {lang: lines[2][lang] + status[lang] for lang in status}
    lines.append(tr.text(_("**Notifications**: {mode}"), mode=""))
    mode = tr.text(NOTIFY_LABELS.get(v.notify, NOTIFY_LABELS["failures"]))
    lines[-1] = {lang: lines[-1][lang] + mode[lang] for lang in mode}
    if v.schedule_type == "subtask":  # only a subtask schedule has a previous Task to overlap
        lines.append(tr.text(_("**Overlap**: {mode}"), mode=""))
        overlap = tr.text(OVERLAP_LABELS.get(v.overlap, OVERLAP_LABELS["allow"]))
        lines[-1] = {lang: lines[-1][lang] + overlap[lang] for lang in overlap}
    elements: list[dict[str, Any]] = [markdown(join(*lines))]
    if v.recent:
        elements.append(markdown(join(tr.text(_("**Last outcomes**")),
                                      *[outcome_line(tr, o, False, v.timezone) for o in v.recent[:5]])))
    else:
        elements.append(markdown(tr.text(_("No runs yet."))))
    if v.notice:
        elements.append(markdown(tr.text(v.notice)))
    toggle = (button(tr.text(_("Resume")), Resume(schedule_id=v.schedule_id), "primary") if v.paused
              else button(tr.text(_("Pause")), Pause(schedule_id=v.schedule_id)))
    elements += [hr(),
                 button_row(button(tr.text(_("History")), History(schedule_id=v.schedule_id)),
                            button(tr.text(_("Results")), Results(schedule_id=v.schedule_id))),
                 button_row(button(tr.text(_("Edit")), EditForm(schedule_id=v.schedule_id), "primary"),
                            button(tr.text(_("Run now")), RunNow(schedule_id=v.schedule_id))),
                 button_row(toggle,
                            button(tr.text(_("Delete")), Delete(schedule_id=v.schedule_id), "danger")),
                 button_row(*[button(tr.text(NOTIFY_BUTTONS[m]),
                                     Notify(schedule_id=v.schedule_id, sub=i))
                              for i, m in enumerate(NOTIFY_MODES) if m != v.notify]),
                 _back(tr, button(tr.text(_("All schedules")), Schedules()))]
    return check_limits(card(tr.text(_("Schedule")), elements))


def render_deleted(name: str, tr: Catalogs) -> dict[str, Any]:
    """Render the card left after a schedule was deleted."""
    elements = [markdown(tr.text(_("Schedule {name} is deleted; its history stays."), name=esc(name))), hr(),
                _back(tr, button(tr.text(_("All schedules")), Schedules()))]
    return check_limits(card(tr.text(_("Schedule")), elements, template="grey"))


def render_history(v: HistoryView, tr: Catalogs) -> dict[str, Any]:
    """Render one page of a schedule's firings."""
    if v.firings:
        body = join(same(f"**{esc(v.name)}**"), *[outcome_line(tr, o, False, v.timezone) for o in v.firings])
    else:
        body = join(same(f"**{esc(v.name)}**"), tr.text(_("No runs yet.")))
    elements: list[dict[str, Any]] = [markdown(body), markdown(tr.text(_("Page {page}"), page=v.page + 1))]
    elements += _pager(tr, "history", v.page, v.page > 0, v.has_more, schedule_id=v.schedule_id)
    elements += [hr(), _back(tr, button(tr.text(_("Schedule")), Detail(schedule_id=v.schedule_id)))]
    return check_limits(card(tr.text(_("History")), elements))


def split_result(text: str, limit: int = RESULT_PART_BYTES) -> list[str]:
    """Split result text into escaped parts of at most `limit` UTF-8 bytes (never inside a character)."""
    parts: list[str] = []
    cur: list[str] = []
    size = 0
    for ch in text:
        e = esc(ch) if ch not in "\n " else ch
        n = len(e.encode())
        if size + n > limit and cur:
            parts.append("".join(cur))
            cur, size = [], 0
        cur.append(e)
        size += n
    if cur or not parts:
        parts.append("".join(cur))
    return parts


def _failure(tr: Catalogs, state: str, error: str) -> dict[str, str]:
    """Return the outcome (the catalog's word) and the hub's error (its own words, escaped as user text)."""
    label = outcome_text(tr, state)
    outcome = tr.text(_("**Outcome**: {outcome}"), outcome="")
    outcome = {lang: outcome[lang] + label[lang] for lang in label}
    if not error:
        return join(outcome, tr.text(_("The hub recorded no error for this run.")))
    if len(error) > ERROR_CHARS:
        error = error[:ERROR_CHARS] + "…"
    return join(outcome, tr.text(_("**Error**: {error}"), error=esc(error)))


def render_results(v: ResultsView, tr: Catalogs) -> dict[str, Any]:
    """Render one part of one firing's Task result (text is already one part, escaped)."""
    elements: list[dict[str, Any]] = []
    if v.firing is None:
        elements.append(markdown(tr.text(_("No results yet: no run of this schedule has a Task result."))))
    else:
        elements.append(markdown(join(same(f"**{esc(v.name)}**"), outcome_line(tr, v.firing, False, v.timezone))))
        if v.firing.state in UNSUCCESSFUL:
            elements.append(markdown(_failure(tr, v.firing.state, v.error)))
        elements.append(markdown(tr.text(_("Part {part} of {parts}"), part=v.part + 1, parts=v.parts)))
        # Result text is the agent's own words: one copy, no translation.
        elements.append({"tag": "markdown", "content": v.text or "—"})
        parts = []
        if v.part > 0:
            parts.append(button(tr.text(_("Previous part")),
                                Results(schedule_id=v.schedule_id, page=v.page, sub=v.part - 1)))
        if v.part + 1 < v.parts:
            parts.append(button(tr.text(_("Next part")),
                                Results(schedule_id=v.schedule_id, page=v.page, sub=v.part + 1)))
        if v.task_id:
            parts.append(timeline_button(tr, "task", v.task_id))
        if parts:
            elements.append(button_row(*parts))
        runs = []
        if v.page > 0:
            runs.append(button(tr.text(_("Newer run")),
                               Results(schedule_id=v.schedule_id, page=v.page - 1)))
        if v.page + 1 < v.pages:
            runs.append(button(tr.text(_("Older run")),
                               Results(schedule_id=v.schedule_id, page=v.page + 1)))
        if runs:
            elements.append(button_row(*runs))
    elements += [hr(), _back(tr, button(tr.text(_("Schedule")), Detail(schedule_id=v.schedule_id)))]
    return check_limits(card(tr.text(_("Results")), elements))
