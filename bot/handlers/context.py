"""What every handler receives (the operator and the hub's services) and what it answers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, TypeVar

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
    chat_type: str | None = None           # a text command's chat: "p2p" (private), "group"; None for a card action


@dataclass(frozen=True)
class Sender:
    """A text command's sender before identity is bound: the application and the sender's Feishu ids."""

    app_id: str
    ids: dict[str, Any]
    services: BotServices
    tr: Catalogs


@dataclass(frozen=True)
class Answer:
    """A handler's result: a refreshed card and/or a toast (`kind`: success | info | warning | error)."""

    card: dict | None = None
    toast: str | None = None            # msgid
    toast_kind: str = "success"
    toast_values: tuple[tuple[str, Any], ...] = ()
    # (msg_type, content) sent to the clicker alone, in a private message (e.g. a one-time sign-in link)
    private: tuple[str, dict] | None = None


class Refused(AmuxError):
    """The operator may not do this; the message is a msgid shown as an error toast, nothing changed."""

    status = 403
    code = "forbidden"


Handler = Callable[[Any, Any], Awaitable[Answer]]
H = TypeVar("H", bound=Handler)


@dataclass(frozen=True)
class Route:
    """The handler of one payload class; `anonymous`: it runs before identity is bound and receives a Sender."""

    handler: Handler
    anonymous: bool = False


ROUTES: dict[type, Route] = {}  # payload class (bot/cards/actions.py) → its route; filled by @handles


def handles(*payloads: type, anonymous: bool = False) -> Callable[[H], H]:
    """Bind the decorated handler to `payloads` (card-action or command classes) in the bot's one router."""
    def bind(handler: H) -> H:
        for payload in payloads:
            ROUTES[payload] = Route(handler, anonymous)
        return handler
    return bind
