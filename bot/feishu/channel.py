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
import contextlib
import time
from collections import deque
from typing import Any, AsyncIterator, Awaitable, Callable

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


class _Call:
    """One paced call: when it was let start, and when its answer came back (None while in flight)."""

    __slots__ = ("start", "end", "ended")

    def __init__(self, start: float) -> None:
        self.start = start
        self.end: float | None = None
        self.ended = asyncio.Event()


class Pacer:
    """At most `rate` calls (rounded down, at least one) per key in any one-second window at the platform, as
    Feishu counts its limits (real time: it paces I/O, not a rule). A burst goes out within the window's first
    `SPREAD`, spaced evenly; the call after a full window starts a second after the window's first call *came
    back* — it reached the platform before that, so however late a call arrives, no window there holds more than
    `rate`. A person waiting for a card is not kept waiting for a rate the platform does not ask for (a leaky
    bucket spaced even a burst of 48 over the whole second)."""

    WINDOW_S = 1.0
    SPREAD = 0.25  # of the window: a full burst of calls starts within its first quarter
    KEYS_MAX = 10_000  # keys remembered; idle ones are forgotten first

    def __init__(self, rate: float) -> None:
        self.burst = max(1, int(rate)) if rate > 0 else 0
        self.gap = self.WINDOW_S * self.SPREAD / self.burst if self.burst else 0.0
        self._calls: dict[str, deque[_Call]] = {}  # per key, its last `burst` calls

    @contextlib.asynccontextmanager
    async def slot(self, key: str) -> AsyncIterator[None]:
        """Wait until `key` may make its next call; the call runs inside the block (its end is when it came back)."""
        if not self.burst:
            yield
            return
        calls = self._calls.get(key)
        if calls is None:
            if len(self._calls) >= self.KEYS_MAX:
                self._forget(time.monotonic())
            calls = self._calls[key] = deque(maxlen=self.burst)
        while True:
            now = time.monotonic()
            at = max(now, calls[-1].start + self.gap) if calls else now
            if len(calls) < self.burst:
                break
            oldest = calls[0]
            if oldest.end is not None:
                at = max(at, oldest.end + self.WINDOW_S)
                break
            await oldest.ended.wait()  # a full window whose first call is still out: wait for its answer
        call = _Call(at)
        calls.append(call)  # and the window's first leaves the deque
        try:
            if at > now:
                await asyncio.sleep(at - now)
            yield
        finally:
            call.end = time.monotonic()
            call.ended.set()

    def _forget(self, now: float) -> None:
        for key in [k for k, c in self._calls.items()
                    if c[-1].end is not None and c[-1].end <= now - self.WINDOW_S]:
            del self._calls[key]


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
        async with contextlib.AsyncExitStack() as paced:
            await paced.enter_async_context(self.app_pacer.slot(app_id))
            if recipient:
                await paced.enter_async_context(self.user_pacer.slot(f"{app_id}/{recipient}"))
            return await self._attempts(app, fn, update)

    async def _attempts(self, app: _App, fn: Callable[[_App, str], Awaitable[Any]], update: bool) -> Delivery:
        """The call, once more with a fresh tenant token if the first was refused for its token."""
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
