"""Card-action routing: a pure check (payload → handler) and the I/O of running it."""
from __future__ import annotations

from typing import Awaitable, Callable

from .cards.actions import BadPayload, CardAction
from .handlers import alert_center, conversation, questions, schedules
from .handlers.context import Answer, Ctx
from .handlers.overview import overview

Handler = Callable[[Ctx, CardAction], Awaitable[Answer]]

ROUTES: dict[str, Handler] = {
    "overview": overview, "schedules": schedules.list_schedules, "detail": schedules.detail,
    "history": schedules.history, "results": schedules.results, "pause": schedules.pause,
    "resume": schedules.resume, "delete": schedules.delete, "alerts": alert_center.alert_center,
    "ack": alert_center.acknowledge, "snooze": alert_center.snooze, "recheck": alert_center.recheck,
    "notify": schedules.notify, "answer": questions.answer, "new": schedules.new_form, "edit": schedules.edit_form,
    "save": schedules.save, "run": schedules.run_now, "stop": conversation.stop,
}


def check(value: object) -> tuple[CardAction, Handler]:
    """Return the parsed action and its handler (pure; raises BadPayload)."""
    action = CardAction.unpack(value)
    handler = ROUTES.get(action.op)
    if handler is None:  # pragma: no cover — OPS and ROUTES are kept together
        raise BadPayload(f"no handler for {action.op}")
    return action, handler


def link_argument(text: str) -> str | None:
    """Return the code of `/amux link CODE` ("" when no code was given); None when the text is something else."""
    words = text.strip().split()
    if len(words) >= 2 and words[0].lower() in ("/amux", "amux") and words[1].lower() == "link":
        return " ".join(words[2:])
    return None


def is_login(text: str) -> bool:
    """Return whether a chat message is `/amux login` (a one-time sign-in link for the hub's OAuth approval page)."""
    words = text.strip().lower().split()
    return len(words) == 2 and words[0] in ("/amux", "amux") and words[1] == "login"


def is_command(text: str) -> bool:
    """Return whether a chat message asks for the overview."""
    words = text.strip().split()
    return bool(words) and words[0].lower() in ("/amux", "amux")
