"""The Agent Timeline button: a card button whose click sends the clicker a one-time sign-in link to the timeline.

The button only names the run (`Timeline`, bot/cards/actions.py); the handler (bot/handlers/timeline.py) checks that the
clicker owns the run or is an admin, then sends them — privately — a login link (`/amux login`'s, ten minutes, one
use) whose `next` lands on `/timeline/tasks/{id}` or `/timeline/turns/{id}`. No token is ever put in a URL.
"""
from __future__ import annotations

from typing import Any

from bot.i18n import Catalogs, _

from .actions import RUN_KINDS, Timeline
from .base import button, card, check_limits, esc, markdown


def timeline_button(tr: Catalogs, kind: str, id: str) -> dict[str, Any]:  # noqa: A002 — the brief's name
    """Return a button that opens the Agent Timeline of a Task (`kind` task) or a Turn (`kind` turn)."""
    if kind not in RUN_KINDS:
        raise ValueError(f"timeline_button kind must be one of {RUN_KINDS}, not {kind!r}")
    return button(tr.text(_("Agent Timeline")), Timeline(run_id=id, run_kind=kind))


def render_timeline_link(tr: Catalogs, kind: str, run_id: str, link: str) -> dict[str, Any]:
    """Render the private card carrying the one-time sign-in link that lands on a run's timeline."""
    message = (_("Open the Agent Timeline of task {id} (one use, 10 minutes): [sign in and open it]({link})")
               if kind == "task" else
               _("Open the Agent Timeline of turn {id} (one use, 10 minutes): [sign in and open it]({link})"))
    what = tr.text(message, id=esc(run_id), link=link)
    return check_limits(card(tr.text(_("Agent Timeline")), [markdown(what)], template="blue"))
