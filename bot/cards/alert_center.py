"""The administrator alert center card (pure): names, status and creators — never prompts or results."""
from __future__ import annotations

from typing import Any

from bot.i18n import Catalogs, _
from hub.domain.states import DeliveryState, IncidentState

from .actions import Ack, Alerts, Overview, Recheck, Snooze
from .alerts import outcome, snooze_label
from .base import Text, button, button_row, card, check_limits, esc, hr, join, markdown, same, when
from .timeline import timeline_button
from .views import AlertCenterView, Diagnostic

STATES: dict[str, str] = {IncidentState.PENDING: _("failing"), IncidentState.OPEN: _("failing"),
                          IncidentState.RECOVERING: _("recovering"), IncidentState.CLOSED: _("recovered"),
                          IncidentState.WITHDRAWN: _("withdrawn")}
DELIVERY: dict[str, str] = {DeliveryState.OK: _("ok"), DeliveryState.SUSPENDED: _("suspended"),
            DeliveryState.UNCONFIGURED: _("no administrator configured")}
NOTICE_KINDS = {"incident": _("incident card"), "card": _("incident card"), "update": _("incident update"),
                "reminder": _("reminder"), "receipt": _("receipt"), "digest": _("digest")}
DIAGNOSTICS = {
    "unconfigured": _("This application has no administrator: set admin_open_id under its [[feishu.apps]] entry; "
                      "notices stay pending until then."),
    "suspended": _("Delivery is suspended (Feishu error {code}): fix the bot's availability or the block, then press "
                   "Recheck delivery."),
    "unconfirmed": _("A {kind} is unconfirmed: Feishu did not say whether it arrived (error {code})."),
    "dead": _("A {kind} could not be delivered (Feishu error {code}); it is not retried."),
}


def diagnostic_text(tr: Catalogs, d: Diagnostic) -> Text:
    """Word one delivery diagnostic from the catalog (its facts only: state, notice kind, Feishu's code)."""
    kind = tr.text(NOTICE_KINDS.get(d.notice_kind, _("notice")))
    message = DIAGNOSTICS.get(d.state, _("Delivery needs attention: {state}."))
    return tr.text(message, code=esc(d.code or "—"), kind=kind, state=esc(d.state))


def render_alert_center(v: AlertCenterView, tr: Catalogs) -> dict[str, Any]:
    """Render one page of active incidents with their controls and the delivery diagnostics."""
    elements: list[dict[str, Any]] = []
    if not v.incidents:
        elements.append(markdown(tr.text(_("No active incidents."))))
    for inc in v.incidents:
        lines = [same(f"**{esc(inc.schedule_name)}**"),
                 tr.text(_("**Status**: {status}"), status=tr.text(STATES.get(inc.state, _("failing")))),
                 tr.text(_("**Created by**: {creator}"), creator=esc(inc.creator or "—")),
                 tr.text(_("**Failures** {failures} · **Missed runs** {missed} · **Unknown** {unknowns}"),
                         failures=inc.failures, missed=inc.missed, unknowns=inc.unknowns)]
        if inc.last_outcome:
            lines.append(tr.text(_("**Last outcome**: {last}"), last=outcome(tr, inc.last_outcome)))
        if inc.acknowledged:
            lines.append(tr.text(_("Acknowledged — no more reminders.")))
        elif inc.snoozed_until:
            lines.append(tr.text(_("Snoozed until {time}."), time=when(inc.snoozed_until, v.timezone)))
        elements.append(markdown(join(*lines)))
        buttons = []
        if not inc.acknowledged:
            buttons.append(button(tr.text(_("Acknowledge")), Ack(incident_id=inc.incident_id),
                                  "primary"))
            buttons.append(button(snooze_label(tr, v.snooze_s), Snooze(incident_id=inc.incident_id)))
        if inc.run_id:  # the administrator opens the failing run's Agent Timeline (a private sign-in link)
            buttons.append(timeline_button(tr, inc.run_kind, inc.run_id))
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
    state = tr.text(DELIVERY[v.delivery_state]) if v.delivery_state in DELIVERY else same(esc(v.delivery_state))
    diag = [tr.text(_("**Delivery**: {state}"), state=state)]
    diag += [join(same("- "), diagnostic_text(tr, d), sep="") for d in v.diagnostics[:10]]
    elements.append(markdown(join(*diag)))
    elements.append(button_row(button(tr.text(_("Recheck delivery")), Recheck()),
                               button(tr.text(_("Back to overview")), Overview())))
    return check_limits(card(tr.text(_("Alert center")), elements, template="orange"))
