"""The Feishu bot: deduplicated inbound events → identity → handlers → answers.

Transport-free: the webhook, the long connection and the local console all call `accept` with an
event envelope shaped like Feishu's (schema 2.0) and an `Outgoing` for replies, so every path runs the
same handlers and the same authorization.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import TYPE_CHECKING, Any, Awaitable

from hub.errors import AmuxError

from .cards.actions import FORM_ACTIONS, BadPayload, UnknownKey
from .handlers.context import Answer, Ctx, Sender
from .handlers.conversation import NO_ENGINE, converse, say
from .handlers.schedules import LINK_FIRST
from .i18n import Catalogs, _, catalogs
from .identity import IdentityBindings, Viewer
from .services import BotServices
from hub.services.chat.bot import INBOUND_TTL, EngineRefused

if TYPE_CHECKING:  # lark-oapi (thousands of modules) loads only when a Feishu app needs it
    from .feishu.messenger import Outgoing
from .router import check, command, route

log = logging.getLogger(__name__)
ACTION_BUDGET_S = 2.5          # Feishu wants the callback answer within 3 s
MENTION = re.compile(r"@_user_\d+\s*")


class FeishuBot:
    """Serve the configured Feishu applications over the hub's services."""

    def __init__(self, services: BotServices, messenger: Outgoing | None = None, tr: Catalogs | None = None) -> None:
        self.services = services
        self.tr = tr or catalogs()
        self.apps = {a.app_id: a for a in services.feishu.apps}
        self.identity = IdentityBindings(services.identity)
        self._messenger = messenger
        self.background: set[asyncio.Task] = set()

    @property
    def messenger(self) -> Outgoing:
        """Where replies go by default: Feishu through lark-oapi, loaded on first use."""
        if self._messenger is None:
            from .feishu.messenger import LarkMessenger

            self._messenger = LarkMessenger(self.apps.values(), self.services.feishu.timeout_s)
        return self._messenger

    # ------------------------------------------------------------ plumbing

    def spawn(self, work: Awaitable[Any]) -> asyncio.Task:
        """Run slow work after the answer was sent; kept referenced until done."""
        task = asyncio.ensure_future(work)
        self.background.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self.background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("bot background work failed", exc_info=task.exception())

    async def aclose(self) -> None:
        """Cancel background work; close the messenger's HTTP clients."""
        for t in list(self.background):
            t.cancel()
        await asyncio.gather(*self.background, return_exceptions=True)
        close = getattr(self._messenger, "aclose", None)
        if close is not None:
            await close()

    async def first_seen(self, app_id: str, key: str) -> bool:
        """Record an inbound key; False when it was seen before (a redelivery or a replay)."""
        return await self.services.state.first_seen(app_id, key, INBOUND_TTL, prune=hash(key) % 64 == 0)

    def toast(self, msgid: str, kind: str = "success", **values: Any) -> dict:
        """Return a callback toast with `i18n` texts."""
        text = self.tr.text(msgid, **values)
        return {"type": kind, "content": text["en_us"], "i18n": text}

    # ------------------------------------------------------------ events

    async def accept(self, app_id: str, envelope: dict, out: Outgoing | None = None) -> tuple[dict, Awaitable | None]:
        """Deduplicate and route one event; return (the immediate answer, slow work to run after it)."""
        out = out or self.messenger
        header = envelope.get("header") or {}
        event = envelope.get("event") or {}
        event_id = header.get("event_id") or envelope.get("uuid")
        if not event_id or not await self.first_seen(app_id, f"event:{event_id}"):
            return {}, None
        kind = header.get("event_type")
        if kind == "im.message.receive_v1":
            mid = (event.get("message") or {}).get("message_id")
            if not mid or not await self.first_seen(app_id, f"message:{mid}"):
                return {}, None
            return {}, self.on_message(app_id, event, out)
        if kind == "card.action.trigger":
            return await self.on_action(app_id, {**event, "_event_id": event_id}, out), None
        return {}, None

    async def _viewer(self, app_id: str, ids: dict) -> Viewer | None:
        app = self.apps.get(app_id)
        if app is None or not ids.get("open_id"):
            return None
        return await self.identity.bind(app_id, ids["open_id"], app.admin_open_id, ids.get("union_id"),
                                        ids.get("user_id"))

    async def on_message(self, app_id: str, event: dict, out: Outgoing) -> None:
        """Answer a chat message: a text command (`/amux …`) through the router, with its card; anything else →
        a Turn of the chat's Session on a live progress card, or a steer of the Turn the chat is running
        (hub.services.chat.turns)."""
        sender = event.get("sender") or {}
        msg = event.get("message") or {}
        if sender.get("sender_type") not in (None, "user") or msg.get("message_type") != "text":
            return
        try:
            text = MENTION.sub("", json.loads(msg.get("content") or "{}").get("text") or "").strip()
        except ValueError:
            return
        mid = msg["message_id"]
        ids = sender.get("sender_id") or {}
        payload = command(text)
        to = route(payload) if payload is not None else None
        if to is not None and to.anonymous:
            if app_id not in self.apps:
                return
            answer = await to.handler(Sender(app_id, ids, self.services, self.tr), payload)
        else:
            viewer = await self._viewer(app_id, ids)
            if viewer is None:
                return  # a revoked binding gets no answer at all
            if to is None:
                if text:
                    await self.chat(viewer, msg, text, out)
                return
            answer = await to.handler(Ctx(viewer, self.services, self.tr, chat_type=msg.get("chat_type")), payload)
        if answer.card:
            await out.reply(app_id, mid, "interactive", answer.card, f"amux-{mid}")

    async def chat(self, viewer: Viewer, msg: dict, text: str, out: Outgoing) -> None:
        """Open a Turn for the message (its progress card goes through the outbox), or steer the running one; a
        refusal is posted through the outbox too."""
        mid = msg["message_id"]
        try:
            await converse(self.services, viewer, msg.get("chat_id") or mid, text, mid)
        except EngineRefused:
            await say(self.services, self.tr, viewer, mid, NO_ENGINE)
        except AmuxError as e:
            await say(self.services, self.tr, viewer, mid, e.message)

    async def viewer_of(self, app_id: str, open_id: str) -> Viewer | None:
        """Return the operator a Feishu user of `app_id` acts as (bound on first sight; None when revoked)."""
        return await self._viewer(app_id, {"open_id": open_id})

    async def on_action(self, app_id: str, event: dict, out: Outgoing) -> dict:
        """Answer a card click within the budget: a toast and/or the refreshed card; finish late work by PATCH."""
        work = asyncio.ensure_future(self._act(app_id, event, out))
        try:
            return await asyncio.wait_for(asyncio.shield(work), ACTION_BUDGET_S)
        except asyncio.TimeoutError:
            message_id = (event.get("context") or {}).get("open_message_id")

            async def finish() -> None:
                res = await work
                if message_id and res.get("card"):
                    await out.patch(app_id, message_id, res["card"]["data"])
            self.spawn(finish())
            return {"toast": self.toast(_("Working on it…"), "info")}

    async def _act(self, app_id: str, event: dict, out: Outgoing) -> dict:
        try:
            action, handler = check((event.get("action") or {}).get("value"))
        except UnknownKey as e:
            return {"toast": self.toast(_("This button carries {keys}, which amux does not know; nothing was changed. "
                                          "Send /amux for a fresh card."), "warning", keys=e.keys)}
        except BadPayload:
            return {"toast": self.toast(_("This button is out of date; send /amux for a fresh card."), "warning")}
        viewer = await self._viewer(app_id, event.get("operator") or {})
        if viewer is None:
            if isinstance(action, FORM_ACTIONS):
                return {"toast": self.toast(LINK_FIRST, "error")}
            return {"toast": self.toast(_("Your Feishu identity is not bound to amux."), "error")}
        act = event.get("action") or {}
        context = event.get("context") or {}
        receipt = {"event_id": event.get("_event_id"), "token": event.get("token"),
                   "open_message_id": context.get("open_message_id"), "open_chat_id": context.get("open_chat_id")}
        try:
            answer: Answer = await handler(Ctx(viewer, self.services, self.tr, form=act.get("form_value"),
                                               receipt=receipt), action)
        except AmuxError as e:
            return {"toast": {"type": "error", "content": self.tr.gettext("en_us", e.message),
                              "i18n": {lang: self.tr.gettext(lang, e.message) for lang in ("en_us", "zh_cn")}}}
        res: dict = {}
        if answer.private:  # to the clicker alone (a sign-in link): never into the chat the card is in
            msg_type, content = answer.private
            self.spawn(out.send(app_id, viewer.open_id, msg_type, content, f"amux-{event.get('_event_id') or ''}"))
        if answer.toast:
            res["toast"] = self.toast(answer.toast, answer.toast_kind, **dict(answer.toast_values))
        if answer.card:
            res["card"] = {"type": "raw", "data": answer.card}
        return res
