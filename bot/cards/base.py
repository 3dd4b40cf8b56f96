"""Card JSON 2.0 building blocks: bilingual texts, button rows in `column_set`s, size limits.

Everything here is pure. Every visible text has `content` (English, the fallback) and `i18n_content`
for `en_us` and `zh_cn`; buttons carry a `callback` behavior whose value is a packed CardAction.
"""
from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo

from .actions import CardAction

MAX_CARD_BYTES = 30 * 1024
MAX_ELEMENTS = 200
LANGS = ("en_us", "zh_cn")
Text = dict[str, str]  # {"en_us": ..., "zh_cn": ...}

_MD_SPECIAL = re.compile(r"([\\`*~\[\]()<>#|])")


def esc(text: Any) -> str:
    """Escape user content for a markdown element (no mentions, links or formatting sneak in)."""
    return _MD_SPECIAL.sub(r"\\\1", str(text))


APP_TIMEZONE = "Asia/Shanghai"  # an application's timezone when its settings name none


@lru_cache(maxsize=64)
def _zone(name: str | None) -> ZoneInfo:
    try:
        return ZoneInfo(name or "UTC")
    except (ValueError, KeyError, OSError):
        return ZoneInfo("UTC")


def when(iso: str | None, tz: str | None) -> str:
    """Return an ISO time as `YYYY-MM-DD HH:MM Zone` in the IANA zone `tz` (UTC when it is unknown): every time a
    card shows names its zone; "—" when there is no time."""
    if not iso:
        return "—"
    try:
        dt = datetime.fromisoformat(iso)
    except ValueError:
        return esc(iso)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    zone = _zone(tz)
    return f"{dt.astimezone(zone):%Y-%m-%d %H:%M} {zone.key}"


def same(text: str) -> Text:
    """Return a language-neutral text (ids, numbers) in both languages."""
    return {lang: text for lang in LANGS}


def join(*parts: Text, sep: str = "\n") -> Text:
    """Join bilingual texts language by language."""
    return {lang: sep.join(p[lang] for p in parts) for lang in LANGS}


def markdown(text: Text) -> dict[str, Any]:
    """Return a markdown element."""
    return {"tag": "markdown", "content": text["en_us"], "i18n_content": dict(text)}


def plain(text: Text) -> dict[str, Any]:
    """Return a plain_text object (titles, button labels)."""
    return {"tag": "plain_text", "content": text["en_us"], "i18n_content": dict(text)}


def hr() -> dict[str, Any]:
    """Return a divider."""
    return {"tag": "hr"}


def button(label: Text, action: CardAction, kind: str = "default") -> dict[str, Any]:
    """Return a button whose click calls back with `action`."""
    return {"tag": "button", "text": plain(label), "type": kind, "width": "fill",
            "behaviors": [{"type": "callback", "value": action.pack()}]}


def button_row(*buttons: dict[str, Any]) -> dict[str, Any]:
    """Return one row of buttons (Card 2.0 has no `action` element: a column_set, one column per button)."""
    return {"tag": "column_set", "flex_mode": "flow", "horizontal_spacing": "small",
            "columns": [{"tag": "column", "width": "auto", "elements": [b]} for b in buttons if b]}


def card(title: Text, elements: list[dict[str, Any]], template: str = "blue") -> dict[str, Any]:
    """Return a Card JSON 2.0 document."""
    return {"schema": "2.0",
            "config": {"update_multi": True, "locales": list(LANGS), "width_mode": "fill"},
            "header": {"title": plain(title), "template": template},
            "body": {"elements": elements}}


def count_elements(node: Any) -> int:
    """Count components (anything with a `tag` other than text objects) in a card."""
    n = 0
    if isinstance(node, dict):
        if node.get("tag") and node.get("tag") not in ("plain_text", "lark_md"):
            n += 1
        for v in node.values():
            n += count_elements(v)
    elif isinstance(node, list):
        for v in node:
            n += count_elements(v)
    return n


def size_bytes(doc: dict[str, Any]) -> int:
    """Return the card's size as Feishu measures it (the JSON string)."""
    return len(json.dumps(doc, ensure_ascii=False).encode())


def check_limits(doc: dict[str, Any]) -> dict[str, Any]:
    """Return `doc` unchanged, or raise ValueError when it breaks Feishu's card limits."""
    if size_bytes(doc) > MAX_CARD_BYTES:
        raise ValueError(f"card is {size_bytes(doc)} bytes; Feishu accepts at most {MAX_CARD_BYTES}")
    if count_elements(doc) > MAX_ELEMENTS:
        raise ValueError(f"card has {count_elements(doc)} elements; Feishu accepts at most {MAX_ELEMENTS}")
    return doc


def to_content(doc: dict[str, Any]) -> str:
    """Serialize a card for the `content` field of a message request."""
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
