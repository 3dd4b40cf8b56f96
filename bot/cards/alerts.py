"""Alert cards: notice view model → Feishu Card JSON 2.0 (pure), and the typed card-action payload.

Every text carries `i18n_content` for `en_us` and `zh_cn`; buttons live inside a `column_set` (Card 2.0
has no `action` rows); each button's callback `value` is a versioned `AlertAction`.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

MAX_CARD_BYTES = 30 * 1024
ACTIONS = ("ack", "snooze", "recheck", "pause")

# Strings for the two languages until the Babel catalog arrives with the bot issue.
TEXT: dict[str, dict[str, str]] = {
    "en_us": {
        "title.incident": "Scheduled task alert: {name}",
        "title.receipt": "Scheduled task finished: {name}",
        "title.digest": "{count} scheduled task alerts",
        "status.pending": "Failing", "status.open": "Failing", "status.recovering": "Recovering",
        "status.closed": "Recovered", "status.withdrawn": "Withdrawn",
        "line.status": "**Status**: {status}",
        "line.creator": "**Created by**: {creator}",
        "line.counts": "**Failures** {failures} · **Missed runs** {missed} · **Unknown** {unknowns}",
        "line.last": "**Last outcome**: {last}",
        "line.since": "**Since**: {since}",
        "line.ack": "Acknowledged — no more reminders.",
        "line.snooze": "Snoozed until {until}.",
        "line.reminder": "Reminder: this incident is still unacknowledged.",
        "line.outcome": "**Outcome**: {outcome}",
        "line.time": "**Scheduled for**: {time}",
        "line.digest_item": "- {name}: {status} (created by {creator})",
        "line.more": "…and {count} more",
        "outcome.succeeded": "succeeded", "outcome.failed": "failed", "outcome.cancelled": "cancelled",
        "outcome.timed_out": "timed out", "outcome.missed": "missed", "outcome.unknown": "unknown (not observed)",
        "unknown_creator": "unknown",
        "btn.ack": "Acknowledge", "btn.snooze": "Snooze 24 h", "btn.recheck": "Recheck", "btn.pause": "Pause schedule",
    },
    "zh_cn": {
        "title.incident": "定时任务告警：{name}",
        "title.receipt": "定时任务已结束：{name}",
        "title.digest": "{count} 条定时任务告警",
        "status.pending": "失败中", "status.open": "失败中", "status.recovering": "恢复中",
        "status.closed": "已恢复", "status.withdrawn": "已撤回",
        "line.status": "**状态**：{status}",
        "line.creator": "**创建者**：{creator}",
        "line.counts": "**失败** {failures} · **错过** {missed} · **未知** {unknowns}",
        "line.last": "**最近结果**：{last}",
        "line.since": "**开始于**：{since}",
        "line.ack": "已确认，不再提醒。",
        "line.snooze": "已暂缓提醒，直到 {until}。",
        "line.reminder": "提醒：此告警尚未确认。",
        "line.outcome": "**结果**：{outcome}",
        "line.time": "**计划时间**：{time}",
        "line.digest_item": "- {name}：{status}（创建者 {creator}）",
        "line.more": "……还有 {count} 条",
        "outcome.succeeded": "成功", "outcome.failed": "失败", "outcome.cancelled": "已取消",
        "outcome.timed_out": "超时", "outcome.missed": "错过", "outcome.unknown": "未知（未观察到）",
        "unknown_creator": "未知",
        "btn.ack": "确认", "btn.snooze": "暂缓 24 小时", "btn.recheck": "重新检查", "btn.pause": "暂停定时任务",
    },
}
LANGS = ("en_us", "zh_cn")


@dataclass(frozen=True)
class AlertAction:
    """A card button's callback value: `{"p": "alert", "v": 1, "a": action, "i": incident, "app": app_id}`."""

    action: str
    incident_id: str
    app_id: str
    prefix = "alert"
    version = 1

    def pack(self) -> dict[str, Any]:
        """Return the JSON value carried by the button."""
        return {"p": self.prefix, "v": self.version, "a": self.action, "i": self.incident_id, "app": self.app_id}

    @classmethod
    def unpack(cls, value: Any) -> "AlertAction":
        """Parse a callback value; raise ValueError for another prefix, version or action."""
        if not isinstance(value, dict) or value.get("p") != cls.prefix:
            raise ValueError("not an alert action")
        if value.get("v") != cls.version:
            raise ValueError(f"alert action version {value.get('v')!r} is not supported (expected {cls.version})")
        if value.get("a") not in ACTIONS or not isinstance(value.get("i"), str) or not isinstance(value.get("app"), str):
            raise ValueError("malformed alert action")
        return cls(value["a"], value["i"], value["app"])


def _t(key: str, **kw: Any) -> dict[str, str]:
    return {lang: TEXT[lang][key].format(**kw) for lang in LANGS}


def _outcome(value: str | None) -> dict[str, str]:
    key = f"outcome.{value}"
    return {lang: TEXT[lang].get(key, value or "-") for lang in LANGS}


def _md(i18n: dict[str, str]) -> dict[str, Any]:
    return {"tag": "markdown", "content": i18n["en_us"], "i18n_content": i18n}


def _join(*parts: dict[str, str]) -> dict[str, str]:
    return {lang: "\n".join(p[lang] for p in parts) for lang in LANGS}


def _header(title: dict[str, str], template: str) -> dict[str, Any]:
    return {"title": {"tag": "plain_text", "content": title["en_us"], "i18n_content": title}, "template": template}


def _buttons(view: dict[str, Any]) -> dict[str, Any]:
    columns = []
    for action, style in (("ack", "primary"), ("snooze", "default"), ("recheck", "default"), ("pause", "danger")):
        label = _t(f"btn.{action}")
        value = AlertAction(action, view["incident_id"], view["app_id"]).pack()
        columns.append({"tag": "column", "width": "auto", "elements": [{
            "tag": "button", "type": style, "text": {"tag": "plain_text", "content": label["en_us"], "i18n_content": label},
            "behaviors": [{"type": "callback", "value": value}]}]})
    return {"tag": "column_set", "flex_mode": "flow", "columns": columns}


def _card(header: dict[str, Any], elements: list[dict[str, Any]]) -> dict[str, Any]:
    return {"schema": "2.0", "config": {"update_multi": True, "locales": list(LANGS)}, "header": header,
            "body": {"elements": elements}}


def _creator(view: dict[str, Any]) -> dict[str, str]:
    name = view.get("creator")
    return _t("line.creator", creator=name) if name else {lang: TEXT[lang]["line.creator"].format(
        creator=TEXT[lang]["unknown_creator"]) for lang in LANGS}


def render_incident(view: dict[str, Any]) -> dict[str, Any]:
    """Render an incident card (new card, update or reminder)."""
    status = view.get("status", "open")
    status_text = {lang: TEXT[lang].get(f"status.{status}", status) for lang in LANGS}
    lines = [{lang: TEXT[lang]["line.status"].format(status=status_text[lang]) for lang in LANGS}, _creator(view),
             _t("line.counts", failures=view.get("failures", 0), missed=view.get("missed", 0),
                unknowns=view.get("unknowns", 0)),
             {lang: TEXT[lang]["line.last"].format(last=_outcome(view.get("last_outcome"))[lang]) for lang in LANGS},
             _t("line.since", since=view.get("opened_at") or "-")]
    if view.get("acknowledged"):
        lines.append(_t("line.ack"))
    elif view.get("snoozed_until"):
        lines.append(_t("line.snooze", until=view["snoozed_until"]))
    if view.get("notice") == "reminder":
        lines.insert(0, _t("line.reminder"))
    template = {"closed": "green", "recovering": "yellow", "withdrawn": "grey"}.get(status, "red")
    elements: list[dict[str, Any]] = [_md(_join(*lines))]
    if status in ("pending", "open", "recovering"):
        elements.append(_buttons(view))
    return _card(_header(_t("title.incident", name=view.get("schedule_name", "?")), template), elements)


def render_receipt(view: dict[str, Any]) -> dict[str, Any]:
    """Render a one-shot schedule's receipt."""
    outcome = view.get("outcome")
    lines = [{lang: TEXT[lang]["line.outcome"].format(outcome=_outcome(outcome)[lang]) for lang in LANGS},
             _creator(view), _t("line.time", time=view.get("nominal_time") or "-")]
    template = "green" if outcome == "succeeded" else "red"
    return _card(_header(_t("title.receipt", name=view.get("schedule_name", "?")), template), [_md(_join(*lines))])


def render_digest(view: dict[str, Any]) -> dict[str, Any]:
    """Render a digest of notices the rate limit folded together (trimmed to stay under 30 KB)."""
    items = list(view.get("items", []))
    shown = items
    while True:
        lines = []
        for it in shown:
            status = it.get("status") or it.get("outcome") or "-"
            lines.append({lang: TEXT[lang]["line.digest_item"].format(
                name=it.get("schedule_name", "?"), status=TEXT[lang].get(f"status.{status}", _outcome(status)[lang]),
                creator=it.get("creator") or TEXT[lang]["unknown_creator"]) for lang in LANGS})
        if len(shown) < len(items):
            lines.append(_t("line.more", count=len(items) - len(shown)))
        card = _card(_header(_t("title.digest", count=len(items)), "orange"), [_md(_join(*lines))])
        if card_bytes(card) <= MAX_CARD_BYTES or not shown:
            return card
        shown = shown[: len(shown) // 2]


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


__all__ = ["AlertAction", "render", "card_bytes", "to_content", "asdict"]
