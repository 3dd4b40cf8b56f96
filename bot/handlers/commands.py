"""Text commands: `/amux help` (and any command word the bot does not know), `/amux login`, `/amux link CODE`.

`/amux` alone is the Overview payload, answered by the overview handler as its button is.
"""
from __future__ import annotations

from bot.cards.actions import Help, Link, Login
from bot.cards.base import card, check_limits, esc, markdown
from bot.cards.help import render_help
from bot.cards.identity import LINK_REFUSED, render_link_result
from bot.i18n import _
from hub.services.auth.identity import LinkRefused

from .context import Answer, Ctx, Sender, handles


@handles(Help)
async def help_card(ctx: Ctx, a: Help) -> Answer:
    """List what the bot understands; an unknown command word is named first."""
    return Answer(card=render_help(ctx.tr, a.unknown))


@handles(Login)
async def login(ctx: Ctx, _a: Login) -> Answer:
    """Answer with a one-time link (10 minutes) that signs this principal in on the hub's OAuth approval page, so a
    hosted MCP client can be approved without pasting a token. Only in a private chat: anyone in a group could use
    the link."""
    if ctx.chat_type not in (None, "p2p"):
        text = ctx.tr.text(_("Send `/amux login` to me in a private chat: a sign-in link must not be seen "
                             "by others."))
    else:
        base = ctx.services.public_url or ctx.services.runner_dispatch.hub_url
        link = await ctx.services.oauth.issue_login_link(ctx.viewer.principal_id, base)
        text = ctx.tr.text(_("Sign in as **{principal}** on the hub's approval page (one use, 10 minutes): "
                             "[open the link]({link})"), principal=esc(ctx.viewer.name), link=link)
    return Answer(card=check_limits(card(ctx.tr.text(_("Sign in")), [markdown(text)], template="blue")))


@handles(Link, anonymous=True)  # before identity: linking may re-activate an unlinked identity
async def link(s: Sender, a: Link) -> Answer:
    """Bind the sender's identity to the code's principal, or say how to get a code."""
    if not s.ids.get("open_id"):
        return Answer()
    try:
        linked = await s.services.identity.redeem(a.code, s.app_id, s.ids["open_id"], s.ids.get("union_id"),
                                                  s.ids.get("user_id"))
    except LinkRefused as e:
        return Answer(card=render_link_result(s.tr, LINK_REFUSED[e.reason], ok=False))
    msg = _("Linked: this Feishu identity now acts as **{principal}**. Schedules {principal} creates over "
            "MCP or the CLI notify through this identity.") if linked.changed else \
        _("This Feishu identity was already linked to **{principal}**.")
    return Answer(card=render_link_result(s.tr, msg, ok=True, principal=linked.principal))
