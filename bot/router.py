"""The bot's one router: a payload (a card button's or a text command's, bot/cards/actions.py) → its handler.

Handlers bind to payload classes with `@handles` (bot/handlers/context.py); importing the handler modules here
registers them. `check` is pure (a card callback's value → its payload and handler); `command` parses a chat
message into a text command's payload, or None for a message that is a Turn of the chat's Session.
"""
from __future__ import annotations

from .cards.actions import CardAction, Command, parse_text
from .handlers import alert_center, commands, conversation, overview, questions, schedules, timeline
from .handlers.context import ROUTES, Handler, Route

# each registers its routes on import
HANDLER_MODULES = (alert_center, commands, conversation, overview, questions, schedules, timeline)


def route(payload: CardAction | Command) -> Route:
    """Return the route of a payload (every payload class has exactly one; tests/unit/test_cards.py checks)."""
    return ROUTES[type(payload)]


def check(value: object) -> tuple[CardAction, Handler]:
    """Return the parsed card action and its handler (pure; raises BadPayload)."""
    action = CardAction.unpack(value)
    return action, route(action).handler


def command(text: str) -> CardAction | Command | None:
    """Return the payload of a text command (`/amux …`), or None when the message is for the agent."""
    return parse_text(text)
