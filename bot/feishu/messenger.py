"""Outgoing chat messages of the bot: lark-oapi's request models (reply to a message, PATCH a card).

Each application's requests go over its one long-lived HTTP client (bot.feishu.transport), with the
hub-managed tenant token (bot.feishu.token) per request, like the alert channel, and a stable request uuid
per inbound message so a retried reply is deduplicated by Feishu.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Iterable, Protocol

from lark_oapi.api.im.v1 import (CreateMessageRequest, CreateMessageRequestBody, CreateMessageResponse,
                                 PatchMessageRequest, PatchMessageRequestBody, PatchMessageResponse,
                                 ReplyMessageRequest, ReplyMessageRequestBody, ReplyMessageResponse)

from hub.config import FeishuAppSettings

from .token import TenantToken, TokenError
from .transport import AppTransport

log = logging.getLogger(__name__)
TOKEN_INVALID = {99991663, 99991661, 99991668}


class Outgoing(Protocol):
    """Where the bot's answers go (Feishu, or the local console)."""

    async def reply(self, app_id: str, message_id: str, msg_type: str, content: dict, uuid: str) -> str | None:
        """Reply under `message_id`; return the new message id (None when it failed)."""

    async def patch(self, app_id: str, message_id: str, card: dict) -> bool:
        """Replace the card `message_id`; return whether it worked."""

    async def send(self, app_id: str, open_id: str, msg_type: str, content: dict, uuid: str) -> str | None:
        """Send a private message to one user (`open_id`); return its message id (None when it failed)."""


class LarkMessenger:
    """Send the bot's replies (lark-oapi models) to each configured application's Open Platform."""

    def __init__(self, apps: Iterable[FeishuAppSettings], timeout_s: float = 10.0) -> None:
        self.apps: dict[str, tuple[AppTransport, TenantToken]] = {}
        for a in apps:
            http = AppTransport(a.base_url, timeout_s)
            self.apps[a.app_id] = (http, TenantToken(a.base_url, a.app_id, a.app_secret, timeout_s, http=http))

    async def _call(self, app_id: str, fn) -> Any:  # noqa: ANN001
        if app_id not in self.apps:
            log.warning("Feishu application %s is not configured; reply dropped", app_id)
            return None
        http, token = self.apps[app_id]
        for attempt in range(2):
            try:
                tok = await token.get()
            except TokenError as e:
                log.warning("reply not sent: %s", e)
                return None
            resp = await fn(http, tok)
            if resp.code in TOKEN_INVALID and attempt == 0:
                token.invalidate(tok)
                continue
            if resp.code != 0:
                log.warning("Feishu answered %s %s", resp.code, resp.msg)
                return None
            return resp
        return None

    async def reply(self, app_id: str, message_id: str, msg_type: str, content: dict, uuid: str) -> str | None:
        """Reply under `message_id` with a card (`interactive`) or `text`."""
        body = (ReplyMessageRequestBody.builder().msg_type(msg_type)
                .content(json.dumps(content, ensure_ascii=False)).uuid(uuid[:50]).build())
        req = ReplyMessageRequest.builder().message_id(message_id).request_body(body).build()
        resp = await self._call(app_id, lambda http, tok: http.call(req, tok, ReplyMessageResponse))
        return getattr(getattr(resp, "data", None), "message_id", None) if resp else None

    async def send(self, app_id: str, open_id: str, msg_type: str, content: dict, uuid: str) -> str | None:
        """Send a card or text to one user's private chat with the bot (`receive_id_type=open_id`)."""
        body = (CreateMessageRequestBody.builder().receive_id(open_id).msg_type(msg_type)
                .content(json.dumps(content, ensure_ascii=False)).uuid(uuid[:50]).build())
        req = CreateMessageRequest.builder().receive_id_type("open_id").request_body(body).build()
        resp = await self._call(app_id, lambda http, tok: http.call(req, tok, CreateMessageResponse))
        return getattr(getattr(resp, "data", None), "message_id", None) if resp else None

    async def patch(self, app_id: str, message_id: str, card: dict) -> bool:
        """PATCH the card `message_id` (Feishu allows it for 14 days after sending)."""
        body = PatchMessageRequestBody.builder().content(json.dumps(card, ensure_ascii=False)).build()
        req = PatchMessageRequest.builder().message_id(message_id).request_body(body).build()
        return await self._call(app_id, lambda http, tok: http.call(req, tok, PatchMessageResponse)) is not None

    async def aclose(self) -> None:
        """Close every application's HTTP client."""
        for http, _token in self.apps.values():
            await http.aclose()
