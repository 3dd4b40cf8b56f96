"""The `/amux` overview card (pure)."""
from __future__ import annotations

from typing import Any

from bot.i18n import Catalogs, _

from .actions import Alerts, NewForm, Schedules
from .base import button, button_row, card, check_limits, esc, hr, join, markdown, when
from .views import Outcome, OverviewView

OUTCOMES = {
    "succeeded": _("succeeded"), "failed": _("failed"), "cancelled": _("cancelled"), "timed_out": _("timed out"),
    "missed": _("missed"), "unknown": _("unknown (not observed)"), "pending": _("running"),
    "skipped": _("skipped"), "error": _("not admitted"), "unconfirmed": _("unconfirmed"),
}


def outcome_text(tr: Catalogs, state: str) -> dict[str, str]:
    """Return the bilingual label of an outcome state."""
    return tr.text(OUTCOMES.get(state, _("unknown (not observed)")))


def outcome_line(tr: Catalogs, o: Outcome, with_name: bool = True, tz: str | None = None) -> dict[str, str]:
    """Return one bilingual line `- name · time zone · outcome` (the time in zone `tz`, named)."""
    label = outcome_text(tr, o.state)
    at = when(o.nominal_time, tz)
    head = f"- {esc(o.schedule_name)} · " if with_name else "- "
    return {lang: f"{head}{at} · {label[lang]}" for lang in label}


def render_overview(v: OverviewView, tr: Catalogs) -> dict[str, Any]:
    """Render the personal summary with the schedule entries sharing one button row."""
    summary = tr.text(_("**Your schedules**: {total} · **failing**: {failing} · **paused**: {paused}"),
                      total=v.total, failing=v.failing, paused=v.paused)
    hello = tr.text(_("Hello {name}."), name=esc(v.viewer)) if v.viewer else tr.text(_("Hello."))
    elements: list[dict[str, Any]] = [markdown(hello), markdown(summary)]
    if v.latest:
        elements.append(markdown(join(tr.text(_("**Latest outcomes**")),
                                      *[outcome_line(tr, o, tz=v.timezone) for o in v.latest[:5]])))
    else:
        elements.append(markdown(tr.text(_("No outcomes yet."))))
    if v.is_admin:
        elements.append(markdown(tr.text(_("**Active incidents** (administrator): {count}"), count=v.active_incidents)))
    elements.append(hr())
    buttons = [button(tr.text(_("Personal schedules")), Schedules(), "primary")]
    if v.is_admin:
        buttons.append(button(tr.text(_("Alert center")), Alerts()))
    buttons.append(button(tr.text(_("New schedule")), NewForm()))
    elements.append(button_row(*buttons))
    return check_limits(card(tr.text(_("amux overview")), elements))
