"""Alert cards: notice view model → Feishu Card JSON 2.0 (pure), built with the card toolkit (`base.py`).

Every text carries `i18n_content` for `en_us` and `zh_cn`, every word from the catalog; user text (schedule and
creator names, comments) is escaped; every time names its zone (the schedule's). Buttons live inside a
`column_set`; each button's callback `value` is a packed `CardAction` (the same payloads the bot's router
accepts), with `view="inc"` so the answer re-renders this incident card in place. The administrator's cards carry
Acknowledge, Snooze and Recheck only: no execution control (the creator pauses from their own view).
"""
from __future__ import annotations

import re
from typing import Any

from bot.i18n import Catalogs, _, catalogs
from hub.domain.alerts import ACTIVE
from hub.domain.states import IncidentState

from .actions import Ack, Recheck, Snooze
from .base import MAX_CARD_BYTES, Text, button, button_row, card, esc, join, markdown, to_content, when

ACTIONS = ("ack", "snooze", "recheck")
MAX_DIGEST_ITEMS = 60   # each item may take two elements; a card holds at most 200
DEFAULT_SNOOZE_S = 86400.0

STATUS: dict[str, str] = {IncidentState.PENDING: _("Failing"), IncidentState.OPEN: _("Failing"),
          IncidentState.RECOVERING: _("Recovering"), IncidentState.CLOSED: _("Recovered"),
          IncidentState.WITHDRAWN: _("Withdrawn")}
OUTCOME = {"succeeded": _("succeeded"), "failed": _("failed"), "cancelled": _("cancelled"), "timed_out": _("timed out"),
           "missed": _("missed"), "unknown": _("unknown (not observed)"), "unconfirmed": _("unconfirmed")}
# A refused dispatch's admission (`skipped:<why>`, `error:<the hub's reason>`), in the catalog's words.
ADMISSION = {"skipped:offline": _("skipped: no runtime with its engine was online"),
             "skipped:overlap": _("skipped: the previous run was still unfinished")}
SKIPPED = _("skipped")
NOT_ADMITTED = _("not admitted: the hub refused this run (`amux alerts explain` with the firing id says why)")
BUTTONS = {"ack": _("Acknowledge"), "snooze": _("Snooze {duration}"), "recheck": _("Recheck")}
UNKNOWN_CREATOR = _("unknown")
OPEN_ID = re.compile(r"^ou_[A-Za-z0-9_-]{1,100}$")


def duration(tr: Catalogs, seconds: float) -> Text:
    """Return a snooze length in the catalog's words: whole hours as hours, else minutes, else seconds."""
    s = int(seconds)
    if s >= 3600 and s % 3600 == 0:
        return tr.text(_("{n} h"), n=s // 3600)
    if s >= 60 and s % 60 == 0:
        return tr.text(_("{n} min"), n=s // 60)
    return tr.text(_("{n} s"), n=s)


def snooze_label(tr: Catalogs, seconds: float | None) -> Text:
    """Return the Snooze button's label for `alerts.snooze_s`."""
    return tr.text(BUTTONS["snooze"], duration=duration(tr, seconds or DEFAULT_SNOOZE_S))


def outcome(tr: Catalogs, value: str | None) -> Text:
    """Return an outcome, or a refused dispatch's admission, as the catalog words it (never the hub's English)."""
    if value in OUTCOME:
        return tr.text(OUTCOME[value])
    if value in ADMISSION:
        return tr.text(ADMISSION[value])
    if value and value.startswith("skipped"):
        return tr.text(SKIPPED)
    if value and value.startswith("error"):
        return tr.text(NOT_ADMITTED)
    return tr.text(_("unknown (not observed)")) if value else {"en_us": "-", "zh_cn": "-"}


def _status(tr: Catalogs, value: str | None) -> Text:
    return tr.text(STATUS[value]) if value in STATUS else outcome(tr, value)


def _creator(tr: Catalogs, name: str | None) -> Text | str:
    return esc(name) if name else tr.text(UNKNOWN_CREATOR)


def _who(tr: Catalogs, by: str | None) -> Text | str:
    """Name who acknowledged: a Feishu user as a mention (a card click), a principal by its name (CLI, REST)."""
    if not by:
        return tr.text(UNKNOWN_CREATOR)
    return f"<at id={by}></at>" if OPEN_ID.match(by) else esc(by)


def _name(view: dict[str, Any]) -> str:
    """A schedule's name inside markdown: escaped."""
    return esc(view.get("schedule_name") or "?")


def _title_name(view: dict[str, Any]) -> str:
    """A schedule's name in a header (plain text: nothing in it renders, so it is shown as written)."""
    return str(view.get("schedule_name") or "?")


def _acknowledged(tr: Catalogs, view: dict[str, Any], tz: str | None) -> list[Text]:
    """Say who acknowledged the incident and when, and their comment (user text, escaped)."""
    if not view.get("acked_at"):  # a card queued before acknowledgements carried their author
        return [tr.text(_("Acknowledged — no more reminders."))]
    lines = [tr.text(_("**Acknowledged** by {who} at {at} — no more reminders."), who=_who(tr, view.get("acked_by")),
                     at=when(view["acked_at"], tz))]
    if view.get("ack_comment"):
        lines.append(tr.text(_("**Comment**: {comment}"), comment=esc(view["ack_comment"])))
    return lines


def _buttons(tr: Catalogs, view: dict[str, Any]) -> dict[str, Any]:
    """Acknowledge and Snooze while unacknowledged; Recheck (delivery) always."""
    iid = view["incident_id"]
    recheck = button(tr.text(BUTTONS["recheck"]), Recheck(incident_id=iid, view="inc"))
    if view.get("acknowledged"):
        return button_row(recheck)
    return button_row(button(tr.text(BUTTONS["ack"]), Ack(incident_id=iid, view="inc"), "primary"),
                      button(snooze_label(tr, view.get("snooze_s")), Snooze(incident_id=iid, view="inc")),
                      recheck)


def render_incident(view: dict[str, Any], tr: Catalogs | None = None) -> dict[str, Any]:
    """Render an incident card (new card, update or reminder)."""
    tr = tr or catalogs()
    tz = view.get("timezone")
    status = view.get("status", IncidentState.OPEN)
    lines = [tr.text(_("**Status**: {status}"), status=_status(tr, status)),
             tr.text(_("**Created by**: {creator}"), creator=_creator(tr, view.get("creator"))),
             tr.text(_("**Failures** {failures} · **Missed runs** {missed} · **Unknown** {unknowns}"),
                     failures=view.get("failures", 0), missed=view.get("missed", 0), unknowns=view.get("unknowns", 0)),
             tr.text(_("**Last outcome**: {last}"), last=outcome(tr, view.get("last_outcome"))),
             tr.text(_("**Since**: {since}"), since=when(view.get("opened_at"), tz))]
    if view.get("acknowledged"):
        lines += _acknowledged(tr, view, tz)
    elif view.get("snoozed_until"):
        lines.append(tr.text(_("Snoozed until {until}."), until=when(view["snoozed_until"], tz)))
    if view.get("notice") == "reminder":
        lines.insert(0, tr.text(_("Reminder: this incident is still unacknowledged.")))
    template = {IncidentState.CLOSED: "green", IncidentState.RECOVERING: "yellow",
                IncidentState.WITHDRAWN: "grey"}.get(status, "red")
    elements: list[dict[str, Any]] = [markdown(join(*lines))]
    if status in ACTIVE:
        elements.append(_buttons(tr, view))
    return card(tr.text(_("Scheduled task alert: {name}"), name=_title_name(view)), elements, template=template)


def render_receipt(view: dict[str, Any], tr: Catalogs | None = None) -> dict[str, Any]:
    """Render a one-shot schedule's receipt."""
    tr = tr or catalogs()
    result = view.get("outcome")
    lines = [tr.text(_("**Outcome**: {outcome}"), outcome=outcome(tr, result)),
             tr.text(_("**Created by**: {creator}"), creator=_creator(tr, view.get("creator"))),
             tr.text(_("**Scheduled for**: {time}"), time=when(view.get("nominal_time"), view.get("timezone")))]
    title = tr.text(_("Scheduled task finished: {name}"), name=_title_name(view))
    return card(title, [markdown(join(*lines))], template="green" if result == "succeeded" else "red")


def render_digest(view: dict[str, Any], tr: Catalogs | None = None) -> dict[str, Any]:
    """Render a digest of notices the rate limit folded together (trimmed to stay under 30 KB).

    Each active incident in it gets its own Acknowledge / Snooze row; the answer to a click is the alert
    center (the digest's in-place refresh: every active incident with its new state), and Recheck is at the end.
    """
    tr = tr or catalogs()
    items = list(view.get("items", []))
    shown = items[:MAX_DIGEST_ITEMS]
    while True:
        elements: list[dict[str, Any]] = []
        for it in shown:
            elements.append(markdown(tr.text(_("- {name}: {status} (created by {creator})"), name=_name(it),
                                             status=_status(tr, it.get("status") or it.get("outcome")),
                                             creator=_creator(tr, it.get("creator")))))
            if it.get("incident_id") and it.get("status") in ACTIVE and not it.get("acknowledged"):
                iid = it["incident_id"]
                elements.append(button_row(
                    button(tr.text(BUTTONS["ack"]), Ack(incident_id=iid), "primary"),
                    button(snooze_label(tr, it.get("snooze_s") or view.get("snooze_s")), Snooze(incident_id=iid))))
        if len(shown) < len(items):
            elements.append(markdown(tr.text(_("…and {count} more"), count=len(items) - len(shown))))
        elements.append(button_row(button(tr.text(BUTTONS["recheck"]), Recheck())))
        doc = card(tr.text(_("{count} scheduled task alerts"), count=len(items)), elements, template="orange")
        if card_bytes(doc) <= MAX_CARD_BYTES or not shown:
            return doc
        shown = shown[: len(shown) // 2]


def render(view: dict[str, Any], tr: Catalogs | None = None) -> dict[str, Any]:
    """Render any notice view model."""
    kind = view.get("kind")
    if kind == "receipt":
        return render_receipt(view, tr)
    if kind == "digest":
        return render_digest(view, tr)
    return render_incident(view, tr)


def card_bytes(doc: dict[str, Any]) -> int:
    """Return the card's size as sent (compact JSON, UTF-8)."""
    return len(to_content(doc).encode())


__all__ = ["render", "card_bytes", "to_content"]
