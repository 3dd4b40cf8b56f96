"""Alert cards: notice view model → Feishu Card JSON 2.0 (pure).

Every text carries `i18n_content` for `en_us` and `zh_cn`; buttons live inside a `column_set` (Card 2.0
has no `action` rows); each button's callback `value` is a packed `CardAction` (the same payloads the bot's
router accepts), with `view="inc"` so the answer re-renders this incident card in place. The administrator's
cards carry Acknowledge, Snooze and Recheck only: no execution control (the creator pauses from their own view).
"""
from __future__ import annotations

import json
import re
from typing import Any

from bot.i18n import _, catalogs
from hub.domain.alerts import ACTIVE
from hub.domain.states import IncidentState

from .actions import CardAction, Recheck
from .base import esc

MAX_CARD_BYTES = 30 * 1024
ACTIONS = ("ack", "snooze", "recheck")
MAX_DIGEST_ITEMS = 60   # each item may take two elements; a card holds at most 200

STATUS = {IncidentState.PENDING: _("Failing"), IncidentState.OPEN: _("Failing"),
          IncidentState.RECOVERING: _("Recovering"), IncidentState.CLOSED: _("Recovered"),
          IncidentState.WITHDRAWN: _("Withdrawn")}
OUTCOME = {"succeeded": _("succeeded"), "failed": _("failed"), "cancelled": _("cancelled"), "timed_out": _("timed out"),
           "missed": _("missed"), "unknown": _("unknown (not observed)")}
BUTTONS = {"ack": _("Acknowledge"), "snooze": _("Snooze 24 h"), "recheck": _("Recheck")}
UNKNOWN_CREATOR = _("unknown")
LANGS = ("en_us", "zh_cn")
OPEN_ID = re.compile(r"^ou_[A-Za-z0-9_-]{1,100}$")


def _t(message: str, **kw: Any) -> dict[str, str]:
    """Translate `message` into both card languages; values marked by `_word` are translated per language too."""
    tr = catalogs()
    return {lang: tr.gettext(lang, message).format(**{k: _value(tr, lang, v) for k, v in kw.items()}) for lang in LANGS}


class _Word(str):
    """A value that is itself a catalog message (a status, an outcome), translated into each language."""


def _value(tr: Any, lang: str, v: Any) -> Any:
    return tr.gettext(lang, v) if isinstance(v, _Word) else v


def _status(value: str | None) -> Any:
    return _Word(STATUS[IncidentState(value)]) if value in STATUS else _outcome(value)


def _outcome(value: str | None) -> Any:
    return _Word(OUTCOME[value]) if value in OUTCOME else (value or "-")


def _md(i18n: dict[str, str]) -> dict[str, Any]:
    return {"tag": "markdown", "content": i18n["en_us"], "i18n_content": i18n}


def _join(*parts: dict[str, str]) -> dict[str, str]:
    return {lang: "\n".join(p[lang] for p in parts) for lang in LANGS}


def _header(title: dict[str, str], template: str) -> dict[str, Any]:
    return {"title": {"tag": "plain_text", "content": title["en_us"], "i18n_content": title}, "template": template}


def _button_column(action: str, style: str, incident_id: str, view: str) -> dict[str, Any]:
    label = _t(BUTTONS[action])
    value = CardAction.of(action, incident_id=incident_id, view=view).pack()
    return {"tag": "column", "width": "auto", "elements": [{
        "tag": "button", "type": style, "text": {"tag": "plain_text", "content": label["en_us"], "i18n_content": label},
        "behaviors": [{"type": "callback", "value": value}]}]}


def _buttons(view: dict[str, Any]) -> dict[str, Any]:
    """Acknowledge and Snooze while unacknowledged; Recheck (delivery) always."""
    actions = [("recheck", "default")] if view.get("acknowledged") else [("ack", "primary"), ("snooze", "default"),
                                                                          ("recheck", "default")]
    columns = [_button_column(a, style, view["incident_id"], "inc") for a, style in actions]
    return {"tag": "column_set", "flex_mode": "flow", "columns": columns}


def _card(header: dict[str, Any], elements: list[dict[str, Any]]) -> dict[str, Any]:
    return {"schema": "2.0", "config": {"update_multi": True, "locales": list(LANGS)}, "header": header,
            "body": {"elements": elements}}


def _creator(view: dict[str, Any]) -> dict[str, str]:
    return _t(_("**Created by**: {creator}"), creator=view.get("creator") or _Word(UNKNOWN_CREATOR))


def _who(by: str | None) -> Any:
    """Name who acknowledged: a Feishu user as a mention (a card click), a principal by its name (CLI, REST)."""
    if not by:
        return _Word(UNKNOWN_CREATOR)
    return f"<at id={by}></at>" if OPEN_ID.match(by) else esc(by)


def _acknowledged(view: dict[str, Any]) -> list[dict[str, str]]:
    """Say who acknowledged the incident and when, and their comment (user text, escaped)."""
    if not view.get("acked_at"):  # a card queued before acknowledgements carried their author
        return [_t(_("Acknowledged — no more reminders."))]
    lines = [_t(_("**Acknowledged** by {who} at {at} — no more reminders."), who=_who(view.get("acked_by")),
                at=view["acked_at"])]
    if view.get("ack_comment"):
        lines.append(_t(_("**Comment**: {comment}"), comment=esc(view["ack_comment"])))
    return lines


def render_incident(view: dict[str, Any]) -> dict[str, Any]:
    """Render an incident card (new card, update or reminder)."""
    status = view.get("status", IncidentState.OPEN)
    lines = [_t(_("**Status**: {status}"), status=_status(status)), _creator(view),
             _t(_("**Failures** {failures} · **Missed runs** {missed} · **Unknown** {unknowns}"),
                failures=view.get("failures", 0), missed=view.get("missed", 0), unknowns=view.get("unknowns", 0)),
             _t(_("**Last outcome**: {last}"), last=_outcome(view.get("last_outcome"))),
             _t(_("**Since**: {since}"), since=view.get("opened_at") or "-")]
    if view.get("acknowledged"):
        lines += _acknowledged(view)
    elif view.get("snoozed_until"):
        lines.append(_t(_("Snoozed until {until}."), until=view["snoozed_until"]))
    if view.get("notice") == "reminder":
        lines.insert(0, _t(_("Reminder: this incident is still unacknowledged.")))
    template = {IncidentState.CLOSED: "green", IncidentState.RECOVERING: "yellow",
                IncidentState.WITHDRAWN: "grey"}.get(status, "red")
    elements: list[dict[str, Any]] = [_md(_join(*lines))]
    if status in ACTIVE:
        elements.append(_buttons(view))
    return _card(_header(_t(_("Scheduled task alert: {name}"), name=view.get("schedule_name", "?")), template),
                 elements)


def render_receipt(view: dict[str, Any]) -> dict[str, Any]:
    """Render a one-shot schedule's receipt."""
    outcome = view.get("outcome")
    lines = [_t(_("**Outcome**: {outcome}"), outcome=_outcome(outcome)), _creator(view),
             _t(_("**Scheduled for**: {time}"), time=view.get("nominal_time") or "-")]
    template = "green" if outcome == "succeeded" else "red"
    title = _t(_("Scheduled task finished: {name}"), name=view.get("schedule_name", "?"))
    return _card(_header(title, template), [_md(_join(*lines))])


def render_digest(view: dict[str, Any]) -> dict[str, Any]:
    """Render a digest of notices the rate limit folded together (trimmed to stay under 30 KB).

    Each active incident in it gets its own Acknowledge / Snooze row; the answer to a click is the alert
    center (the digest's in-place refresh: every active incident with its new state), and Recheck is at the end.
    """
    items = list(view.get("items", []))
    shown = items[:MAX_DIGEST_ITEMS]
    while True:
        elements: list[dict[str, Any]] = []
        for it in shown:
            elements.append(_md(_t(_("- {name}: {status} (created by {creator})"), name=it.get("schedule_name", "?"),
                                   status=_status(it.get("status") or it.get("outcome")),
                                   creator=it.get("creator") or _Word(UNKNOWN_CREATOR))))
            if it.get("incident_id") and it.get("status") in ACTIVE and not it.get("acknowledged"):
                elements.append({"tag": "column_set", "flex_mode": "flow", "columns": [
                    _button_column("ack", "primary", it["incident_id"], ""),
                    _button_column("snooze", "default", it["incident_id"], "")]})
        if len(shown) < len(items):
            elements.append(_md(_t(_("…and {count} more"), count=len(items) - len(shown))))
        elements.append({"tag": "column_set", "flex_mode": "flow", "columns": [_recheck_center()]})
        card = _card(_header(_t(_("{count} scheduled task alerts"), count=len(items)), "orange"), elements)
        if card_bytes(card) <= MAX_CARD_BYTES or not shown:
            return card
        shown = shown[: len(shown) // 2]


def _recheck_center() -> dict[str, Any]:
    label = _t(BUTTONS["recheck"])
    return {"tag": "column", "width": "auto", "elements": [{
        "tag": "button", "type": "default",
        "text": {"tag": "plain_text", "content": label["en_us"], "i18n_content": label},
        "behaviors": [{"type": "callback", "value": Recheck().pack()}]}]}


def render(view: dict[str, Any]) -> dict[str, Any]:
    """Render any notice view model."""
    kind = view.get("kind")
    if kind == "receipt":
        return render_receipt(view)
    if kind == "digest":
        return render_digest(view)
    return render_incident(view)


def card_bytes(card: dict[str, Any]) -> int:
    """Return the card's size as sent (compact JSON, UTF-8)."""
    return len(json.dumps(card, ensure_ascii=False, separators=(",", ":")).encode())


def to_content(card: dict[str, Any]) -> str:
    """Return the `content` string of an interactive message."""
    return json.dumps(card, ensure_ascii=False, separators=(",", ":"))


__all__ = ["render", "card_bytes", "to_content"]
