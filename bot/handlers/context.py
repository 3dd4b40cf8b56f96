"""What every handler receives (the operator and the hub's services) and what it answers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bot.i18n import Catalogs
from bot.identity import Viewer
from bot.services import BotServices

from hub.errors import AmuxError


@dataclass(frozen=True)
class Ctx:
    """One request: the authenticated operator, the application and the hub services."""

    viewer: Viewer
    services: BotServices
    tr: Catalogs
    form: dict[str, Any] | None = None     # a form submission's `form_value` (card.action.trigger)
    receipt: dict[str, Any] | None = None  # this card action: event id, token, message — a created schedule keeps it


@dataclass(frozen=True)
class Answer:
    """A handler's result: a refreshed card and/or a toast (`kind`: success | info | warning | error)."""

    card: dict | None = None
    toast: str | None = None            # msgid
    toast_kind: str = "success"
    toast_values: tuple[tuple[str, Any], ...] = ()


class Refused(AmuxError):
    """The operator may not do this; the message is a msgid shown as an error toast, nothing changed."""

    status = 403
    code = "forbidden"
