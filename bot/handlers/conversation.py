"""Any other chat message: a Turn of that chat's Session, shown on a live progress card (hub.services.chat.turns).

A message while the chat's Turn runs steers it; Stop on the card interrupts it. Every chat output — the card, its
updates, the answer, and a refusal — goes through the outbox.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from bot.cards.actions import StopTurn
from bot.cards.base import card, check_limits, markdown
from bot.i18n import Catalogs, _
from bot.identity import Viewer
from hub.domain.tasks import is_terminal
from hub.services.chat.turns import ChatOrigin, Steered

from .context import Answer, Ctx, Refused, handles

if TYPE_CHECKING:
    from bot.services import BotServices

NO_ENGINE = _("This chat has no agent engine: the hub's default profile is the scripted test engine. Ask your "
              "admin to set `profile = \"<profile>\"` under this application's `[[feishu.apps]]` in the hub's config "
              "(`amux profile list` shows the profiles), then send your message again.")


async def chat_session(services: BotServices, v: Viewer, chat_id: str) -> str:
    """Return the Session of (application, chat, operator), creating it on the first message with the application's
    profile (`[[feishu.apps]] profile`); raise EngineRefused when, with no profile set, it would be the scripted
    test engine. The console's own application (no `[[feishu.apps]]` entry) takes the hub's default as it is."""
    app = next((a for a in services.feishu.apps if a.app_id == v.app_id), None)
    profile = app.profile if app is not None else None
    refuse = "scripted" if app is not None and not profile else None
    return await services.state.chat_session(v.caller(), v.app_id, chat_id, v.principal_id, profile=profile,
                                             refuse_engine=refuse)


def origin(v: Viewer, chat_id: str, session_id: str, reply_to: str) -> ChatOrigin:
    """Return where a chat Turn of `v` comes from and where its cards go."""
    return ChatOrigin(app_id=v.app_id, chat_id=chat_id, open_id=v.open_id, principal_id=v.principal_id,
                      session_id=session_id, reply_to=reply_to,
                      receipt={"app_id": v.app_id, "binding_id": v.binding_id, "open_id": v.open_id,
                               "chat_id": chat_id, "message_id": reply_to})


async def converse(services: BotServices, v: Viewer, chat_id: str, text: str, message_id: str) -> Steered | str:
    """Steer the chat's running Turn with `text`, or open a Turn for it; return what became of it (the new Turn's
    id when it opened one)."""
    sid = await chat_session(services, v, chat_id)
    return await services.chats.send(v.caller(), origin(v, chat_id, sid, message_id), text)


async def say(services: BotServices, tr: Catalogs, v: Viewer, reply_to: str, msgid: str, **values: str) -> None:
    """Answer `reply_to` with a short card through the outbox (a refusal, or what to do)."""
    doc = check_limits(card(tr.text(_("amux")), [markdown(tr.text(msgid, **values))], template="orange"))
    await services.chats.say(v.app_id, v.open_id, reply_to, doc)


@handles(StopTurn)
async def stop(ctx: Ctx, action: StopTurn) -> Answer:
    """Stop the progress card's Turn as the seed's interrupt does (the card then shows it stopped)."""
    ct = await ctx.services.chats.chat_turn(action.turn_id)
    if ct is None or ct["app_id"] != ctx.viewer.app_id:
        raise Refused(_("This card's turn is unknown here; nothing was changed."))
    if ct["principal_id"] != ctx.viewer.principal_id:
        raise Refused(_("This turn belongs to another person: only they can stop it. Nothing was changed."))
    if ct["status"] is None or is_terminal(ct["status"]):
        return Answer(toast=_("This turn has already finished; there is nothing to stop. Nothing was changed."),
                      toast_kind="warning")
    await ctx.services.sessions.tasks.cancel(ctx.viewer.caller(), ct["turn_id"])
    await ctx.services.chats.touched(ct["turn_id"])
    return Answer(toast=_("Stopping the turn; the card shows when it has stopped."), toast_kind="info")
