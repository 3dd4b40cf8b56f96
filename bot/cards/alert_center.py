"""The administrator alert center card (pure): names, status and creators — never prompts or results."""
from __future__ import annotations

from typing import Any

from bot.i18n import Catalogs, _
from hub.domain.states import IncidentState

from .actions import Ack, Alerts, Overview, Recheck, Snooze
from .base import button, button_row, card, check_limits, esc, hr, join, markdown, same
from .views import AlertCenterView

STATES = {IncidentState.PENDING: _("failing"), IncidentState.OPEN: _("failing"),
          IncidentState.RECOVERING: _("recovering"), IncidentState.CLOSED: _("recovered"),
          IncidentState.WITHDRAWN: _("withdrawn")}


def render_alert_center(v: AlertCenterView, tr: Catalogs) -> dict[str, Any]:
    """Render one page of active incidents with their controls and the delivery diagnostics."""
    elements: list[dict[str, Any]] = []
    if not v.incidents:
        elements.append(markdown(tr.text(_("No active incidents."))))
    for inc in v.incidents:
        state = tr.text(STATES[IncidentState(inc.state)] if inc.state in STATES else _("failing"))
        lines = [same(f"**{esc(inc.schedule_name)}**"),
                 tr.text(_("**Status**: {status}"), status=""),
                 tr.text(_("**Created by**: {creator}"), creator=esc(inc.creator or "—")),
                 tr.text(_("**Failures** {failures} · **Missed runs** {missed} · **Unknown** {unknowns}"),
                         failures=inc.failures, missed=inc.missed, unknowns=inc.unknowns)]
        lines[1] = {lang: lines[1][lang] + state[lang] for lang in state}
        if inc.acknowledged:
            lines.append(tr.text(_("Acknowledged — no more reminders.")))
        elif inc.snoozed_until:
            lines.append(tr.text(_("Snoozed until {time}."), time=inc.snoozed_until.replace("T", " ")[:16]))
        elements.append(markdown(join(*lines)))
        buttons = []
        if not inc.acknowledged:
            buttons.append(button(tr.text(_("Acknowledge")), Ack(incident_id=inc.incident_id),
                                  "primary"))
            buttons.append(button(tr.text(_("Snooze 24 h")), Snooze(incident_id=inc.incident_id)))
        if buttons:
            elements.append(button_row(*buttons))
    if v.pages > 1:
        pager = []
        if v.page > 0:
            pager.append(button(tr.text(_("Previous")), Alerts(page=v.page - 1)))
        if v.page + 1 < v.pages:
            pager.append(button(tr.text(_("Next")), Alerts(page=v.page + 1)))
        elements.append(button_row(*pager))
    elements.append(hr())
    diag = [tr.text(_("**Delivery**: {state}"), state=esc(v.delivery_state))]
    diag += [same(f"- {esc(d)}") for d in v.diagnostics[:10]]
    elements.append(markdown(join(*diag)))
    elements.append(button_row(button(tr.text(_("Recheck delivery")), Recheck()),
                               button(tr.text(_("Back to overview")), Overview())))
    return check_limits(card(tr.text(_("Alert center")), elements, template="orange"))
