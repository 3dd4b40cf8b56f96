"""The answer to `/amux link CODE` (pure): linked, or what to do to get a working code."""
from __future__ import annotations

from typing import Any

from bot.i18n import Catalogs, _

from .base import card, check_limits, esc, markdown

LINK_REFUSED = {
    "missing": _("No link code. Run `amux identity link` on your computer and send `/amux link CODE` with the "
                 "code it prints."),
    "malformed": _("That is not a link code. Run `amux identity link` and send the code it prints, "
                   "like `/amux link ABCD-EFGH-JKLM`."),
    "unknown": _("This link code is not known. Check it, or run `amux identity link` for a new one."),
    "expired": _("This link code expired (codes last 10 minutes). Run `amux identity link` again."),
    "used": _("This link code was already used. Run `amux identity link` for a new one."),
    "principal_gone": _("The account this code was made for no longer exists. "
                        "Run `amux identity link` with your current token."),
}


def render_link_result(tr: Catalogs, message: str, *, ok: bool, **values: Any) -> dict[str, Any]:
    """Render the link answer: a green card when linked, an orange one naming the fix otherwise."""
    text = tr.text(message, **{k: esc(v) for k, v in values.items()})
    return check_limits(card(tr.text(_("Link identity")), [markdown(text)], template="green" if ok else "orange"))
