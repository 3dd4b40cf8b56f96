"""The answer to `/amux help` and to a command the bot does not know (pure): what the bot understands."""
from __future__ import annotations

from typing import Any

from bot.i18n import Catalogs, _

from .actions import Overview
from .base import button, button_row, card, check_limits, esc, join, markdown

LINES = (
    _("`/amux`: your overview (your schedules, their latest outcomes; the alert center for the administrator)"),
    _("`/amux help`: this list"),
    _("`/amux login`: a one-time link that signs you in on the hub's approval page (in a private chat)"),
    _("`/amux link CODE`: link this Feishu identity to your amux account, with the code `amux identity link` "
      "prints"),
    _("Any other message: sent to the agent as the next turn of this chat's session; a reply to a question card "
      "answers it"),
)


def render_help(tr: Catalogs, unknown: str = "") -> dict[str, Any]:
    """Render the list of commands; `unknown` (a command word not understood) is named first."""
    lines = [tr.text(_("**What amux understands**")), *(_item(tr, line) for line in LINES)]
    elements: list[dict[str, Any]] = []
    if unknown:
        elements.append(markdown(tr.text(_("amux does not know the command **{command}**."), command=esc(unknown))))
    elements += [markdown(join(*lines)),
                 button_row(button(tr.text(_("Open the overview")), Overview(), "primary"))]
    return check_limits(card(tr.text(_("amux help")), elements, template="orange" if unknown else "blue"))


def _item(tr: Catalogs, line: str) -> dict[str, str]:
    return {lang: f"- {text}" for lang, text in tr.text(line).items()}
