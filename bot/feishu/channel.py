"""The Feishu delivery channel: lark-oapi's message requests over one HTTP client per app, classified for the outbox.

Requests and responses are lark-oapi's models, sent through the application's long-lived client
(bot.feishu.transport; lark-oapi's own async transport opens a client per call). The hub manages the tenant
token itself (bot.feishu.token) and passes it per request; a 99991663 answer refreshes it once and repeats
the call. Classification: 0 → ok; network errors, 5xx, non-JSON bodies,
429 / 99991400 / 230020 / 230049 → retry (honouring `x-ogw-ratelimit-reset`); 230013 / 230053 → suspend;
anything else → permanent (230031 / 230011 / 230110 on an update: the card is gone, send a fresh one).
Calls are paced below Feishu's limits (per application and per recipient) so the outbox rarely sees 429.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any, Awaitable, Callable

from lark_oapi.api.im.v1 import (CreateMessageRequest, CreateMessageRequestBody, CreateMessageResponse,
                                 PatchMessageRequest, PatchMessageRequestBody, PatchMessageResponse,
                                 ReplyMessageRequest, ReplyMessageRequestBody, ReplyMessageResponse)

from bot.cards.alerts import render, to_content
from hub.config import FeishuAppSettings
from hub.services.alerts.channel import OK, PERMANENT, RETRY, SUSPEND, Delivery

from .token import TenantToken, TokenError
from .transport import AppTransport

TOKEN_INVALID = {99991663, 99991661, 99991668}
RETRY_CODES = {99991400, 230020, 230049}
SUSPEND_CODES = {230013, 230053}
CARD_GONE = {230031, 230011, 230110}
RESET_HEADER = "x-ogw-ratelimit-reset"


class Pacer:
    """At most `rate` calls (rounded down, at least one) per key in any one-second window, as Feishu counts its
    limits: a burst goes out within the window's first `SPREAD` (spaced evenly, so the calls also arrive in their
    window), and the call after a full window waits until the window's first call has left it (real time: it paces
    I/O, not a rule). A person waiting for a card is not kept waiting for a rate the platform does not ask for (a
    leaky bucket spaced even a burst of 48 over the whole second)."""

    WINDOW_S = 1.0
    SPREAD = 0.25  # of the window: a full burst of calls starts within its first quarter
    KEYS_MAX = 10_000  # keys remembered; idle ones are forgotten first

    def __init__(self, rate: float) -> None:
        self.burst = max(1, int(rate)) if rate > 0 else 0
        self.gap = self.WINDOW_S * self.SPREAD / self.burst if self.burst else 0.0
        self._slots: dict[str, deque[float]] = {}  # per key, the start times of its last `burst` calls

    async def wait(self, key: str) -> None:
        """Sleep until `key` may make its next call, and count that call."""
        if not self.burst:
            return
        now = time.monotonic()
        slots = self._slots.get(key)
        if slots is None:
            if len(self._slots) >= self.KEYS_MAX:
                self._forget(now)
            slots = self._slots[key] = deque(maxlen=self.burst)
        at = max(now, slots[-1] + self.gap) if slots else now
        if len(slots) == self.burst:
            at = max(at, slots[0] + self.WINDOW_S)
        slots.append(at)
        if at > now:
            await asyncio.sleep(at - now)

    def _forget(self, now: float) -> None:
        for key in [k for k, s in self._slots.items() if s[-1] <= now - self.WINDOW_S]:
            del self._slots[key]


class _App:
    def __init__(self, cfg: FeishuAppSettings, timeout_s: float) -> None:
        self.cfg = cfg
        self.http = AppTransport(cfg.base_url, timeout_s)
        self.token = TenantToken(cfg.base_url, cfg.app_id, cfg.app_secret, timeout_s, http=self.http)


class FeishuChannel:
    """Deliver notices to Feishu applications' administrators (implements hub.services.alerts.channel.Channel)."""

    def __init__(self, apps: list[FeishuAppSettings], timeout_s: float = 10.0, app_rate: float = 48.0,
                 user_rate: float = 4.8) -> None:
        self.apps = {a.app_id: _App(a, timeout_s) for a in apps}
        self.app_pacer = Pacer(app_rate)
        self.user_pacer = Pacer(user_rate)

    @classmethod
    def from_settings(cls, settings: Any) -> "FeishuChannel":
        """Build from hub Settings (`feishu.apps`, `feishu.timeout_s`)."""
        return cls(settings.feishu.apps, settings.feishu.timeout_s)

    async def send(self, app_id: str, recipient: str, view: dict[str, Any], request_uuid: str) -> Delivery:
        """Send an interactive card to `recipient` (open_id) with the notice's uuid."""
        body = (CreateMessageRequestBody.builder().receive_id(recipient).msg_type("interactive")
                .content(_content(view)).uuid(request_uuid).build())
        req = CreateMessageRequest.builder().receive_id_type("open_id").request_body(body).build()
        return await self._call(app_id, recipient, lambda app, tok: app.http.call(req, tok, CreateMessageResponse))

    async def reply(self, app_id: str, message_id: str, view: dict[str, Any], request_uuid: str) -> Delivery:
        """Reply under `message_id` with a card."""
        body = (ReplyMessageRequestBody.builder().msg_type("interactive").content(_content(view))
                .uuid(request_uuid).build())
        req = ReplyMessageRequest.builder().message_id(message_id).request_body(body).build()
        return await self._call(app_id, None, lambda app, tok: app.http.call(req, tok, ReplyMessageResponse))

    async def update(self, app_id: str, message_id: str, view: dict[str, Any]) -> Delivery:
        """PATCH the card `message_id`."""
        body = PatchMessageRequestBody.builder().content(_content(view)).build()
        req = PatchMessageRequest.builder().message_id(message_id).request_body(body).build()
        return await self._call(app_id, None, lambda app, tok: app.http.call(req, tok, PatchMessageResponse),
                                update=True)

    async def _call(self, app_id: str, recipient: str | None,
                    fn: Callable[[_App, str], Awaitable[Any]], update: bool = False) -> Delivery:
        app = self.apps.get(app_id)
        if app is None:
            return Delivery(RETRY, error=f"Feishu application {app_id} is not configured in this hub")
        await self.app_pacer.wait(app_id)
        if recipient:
            await self.user_pacer.wait(f"{app_id}/{recipient}")
        for attempt in range(2):
            try:
                token = await app.token.get()
            except TokenError as e:
                return Delivery(RETRY, error=str(e))
            try:
                resp = await fn(app, token)
            except Exception as e:  # noqa: BLE001 — network errors, timeouts and non-JSON bodies are transient
                return Delivery(RETRY, error=f"{type(e).__name__}: {e}"[:500])
            if resp.code in TOKEN_INVALID and attempt == 0:
                app.token.invalidate(token)
                continue
            return classify(resp, update)
        return Delivery(RETRY, error="tenant token rejected twice")

    async def aclose(self) -> None:
        """Close every application's HTTP client."""
        for app in self.apps.values():
            await app.http.aclose()


def _content(view: dict[str, Any]) -> str:
    """Serialize a notice's card: a chat output carries its rendered card, an alert notice its view model."""
    return to_content(view["card"] if view.get("kind") == "chat" else render(view))


def build_channel(settings: Any) -> FeishuChannel:
    """Build the channel from hub Settings (the composition root loads it by the name in `feishu.channel`)."""
    return FeishuChannel.from_settings(settings)


def classify(resp: Any, update: bool = False) -> Delivery:
    """Map a lark-oapi response onto ok / retry / permanent / suspend."""
    raw = getattr(resp, "raw", None)
    status = getattr(raw, "status_code", None) or 0
    headers = {k.lower(): v for k, v in (getattr(raw, "headers", None) or {}).items()}
    code, msg = resp.code, resp.msg
    reset = None
    if headers.get(RESET_HEADER):
        try:
            reset = float(headers[RESET_HEADER])
        except ValueError:
            reset = None
    if code == 0 and status < 400:
        mid = getattr(getattr(resp, "data", None), "message_id", None)
        return Delivery(OK, message_id=mid)
    if code in SUSPEND_CODES:
        return Delivery(SUSPEND, error=msg, code=code)
    if status == 429 or code in RETRY_CODES:
        return Delivery(RETRY, error=msg or "rate limited", code=code, retry_after_s=reset)
    if status >= 500 or code is None:
        return Delivery(RETRY, error=msg or f"HTTP {status}", code=code)
    return Delivery(PERMANENT, error=msg, code=code, card_gone=update and code in CARD_GONE)
