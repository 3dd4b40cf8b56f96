"""A fake Feishu Open Platform: tenant token, send (one-hour uuid dedup), reply and PATCH over real HTTP.

Faults are queued with `fail(kind, times=1, op=None)`; kinds: "5xx", "429" (with `x-ogw-ratelimit-reset`),
"230013", "230053", "230020", "230031", "99991663" (token invalid), "nonjson", "slow" (answers after
`slow_s`), and "lost" (the message IS accepted but the answer is a 502 — the response was lost on the way).
`limits=True` enforces Feishu's rates (50/s per app, 5 QPS per user) with 429 + 99991400.
`sent` is the log of every accepted new message (deduplicated sends are not logged twice).
`more_apps` ({app_id: secret}) lets one fake serve several applications; each has its own rate budget.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable

from aiohttp import web

TOKEN_PATH = "/open-apis/auth/v3/tenant_access_token/internal"
_counter = itertools.count(1)


@dataclass(kw_only=True)
class Message:
    """One accepted message."""

    message_id: str
    receive_id: str | None
    uuid: str | None
    content: dict
    at: float
    reply_to: str | None = None
    updates: list[dict] = field(default_factory=list)


class FakeFeishu:
    """The fake server; start with `await fake.start()`, stop with `await fake.stop()`."""

    def __init__(self, app_id: str | None = None, app_secret: str = "secret", *, limits: bool = False,
                 now: Callable[[], float] | None = None, dedup_window_s: float = 3600.0, slow_s: float = 2.0,
                 app_rate: int = 50, user_rate: int = 5, more_apps: dict[str, str] | None = None) -> None:
        self.app_id = app_id or f"cli_fake{next(_counter)}_{int(time.time() * 1000) % 10**8}"
        self.app_secret = app_secret
        self.limits = limits
        self.now = now or time.time
        self.dedup_window_s = dedup_window_s
        self.slow_s = slow_s
        self.app_rate, self.user_rate = app_rate, user_rate
        self.tokens: set[str] = set()
        self.secrets = {self.app_id: app_secret, **(more_apps or {})}
        self.token_app: dict[str, str] = {}      # issued token → its application
        self.messages: dict[str, Message] = {}
        self.sent: list[Message] = []           # accepted new messages (sends and replies), in order
        self.patches: list[tuple[str, dict]] = []
        self.requests: list[tuple[str, str, dict]] = []  # (op, uuid or message id, body) of every request seen
        self.rejected_429 = 0
        self._by_uuid: dict[str, tuple[str, float]] = {}
        self._faults: list[list[Any]] = []       # [kind, remaining, op]
        self._app_calls: deque[float] = deque()
        self._app_calls_of: dict[str, deque[float]] = {self.app_id: self._app_calls}
        self._repeats = 0                         # message requests whose uuid was seen in an earlier request
        self._seen_uuids: set[str] = set()
        self.connections: set[Any] = set()       # client (host, port) pairs that carried token or message calls
        self._user_calls: dict[str, deque[float]] = {}
        self._runner: web.AppRunner | None = None
        self.base_url = ""
        self.token_fetches = 0
        self.users: dict[str, str] = {}          # open_id → display name the contact API gives (others: not found)
        self.contact_lookups: list[str] = []

    # ------------------------------------------------------------ control

    def fail(self, kind: str, times: int = 1, op: str | None = None) -> None:
        """Queue a fault for the next `times` calls (of `op`: send | reply | patch | token; None: any message call)."""
        self._faults.append([kind, times, op])

    def clear_faults(self) -> None:
        """Drop queued faults."""
        self._faults.clear()

    def revoke_tokens(self) -> None:
        """Invalidate every issued tenant token (the next call answers 99991663)."""
        self.tokens.clear()

    def sent_to(self, open_id: str) -> list[Message]:
        """Return the accepted messages addressed to `open_id` (replies count for their card's recipient)."""
        out = []
        for m in self.sent:
            target = m.receive_id or (self.messages[m.reply_to].receive_id if m.reply_to in self.messages else None)
            if target == open_id:
                out.append(m)
        return out

    def _fault(self, op: str) -> str | None:
        for f in self._faults:
            if f[1] > 0 and (f[2] is None and op != "token" or f[2] == op):
                f[1] -= 1
                return f[0]
        return None

    # ------------------------------------------------------------ server

    async def start(self, port: int = 0) -> "FakeFeishu":
        """Serve on 127.0.0.1 (a free port unless one is given)."""
        app = web.Application()
        app.router.add_get("/_stats", self._stats)
        app.router.add_post(TOKEN_PATH, self._token)
        app.router.add_post("/open-apis/im/v1/messages", self._send)
        app.router.add_post("/open-apis/im/v1/messages/{message_id}/reply", self._reply)
        app.router.add_patch("/open-apis/im/v1/messages/{message_id}", self._patch)
        app.router.add_get("/open-apis/contact/v3/users/{user_id}", self._user)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001
        self.base_url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()

    async def _stats(self, _request: web.Request) -> web.Response:
        """What a benchmark running the fake in another process needs: accepted sends and their uuids."""
        return web.json_response({"sent": len(self.sent), "uuids": [m.uuid for m in self.sent],
                                  "first_at": self.sent[0].at if self.sent else None,
                                  "last_at": self.sent[-1].at if self.sent else None,
                                  "rejected_429": self.rejected_429, "requests": len(self.requests),
                                  "repeated_uuid_requests": self._repeats})

    @staticmethod
    def _json(code: int, msg: str = "success", data: Any = None, status: int = 200,
              headers: dict | None = None) -> web.Response:
        body = {"code": code, "msg": msg}
        if data is not None:
            body["data"] = data
        return web.json_response(body, status=status, headers=headers)

    async def _token(self, request: web.Request) -> web.Response:
        self.connections.add(request.transport.get_extra_info("peername") if request.transport else None)
        body = await request.json()
        if self._fault("token") == "5xx":
            return web.Response(status=503, text="unavailable")
        app_id = body.get("app_id")
        if app_id not in self.secrets or body.get("app_secret") != self.secrets[app_id]:
            return self._json(10014, "app secret invalid")
        token = f"t-{app_id}-{next(_counter)}"
        self.tokens.add(token)
        self.token_app[token] = app_id
        self.token_fetches += 1
        return web.json_response({"code": 0, "msg": "ok", "tenant_access_token": token, "expire": 7200})

    def _limited(self, user: str | None, app_id: str | None = None) -> bool:
        if not self.limits:
            return False
        now = time.monotonic()
        q = self._app_calls_of.setdefault(app_id or self.app_id, deque())
        while q and q[0] <= now - 1.0:
            q.popleft()
        uq = self._user_calls.setdefault(f"{app_id or self.app_id}/{user}", deque()) if user else None
        while uq and uq[0] <= now - 1.0:
            uq.popleft()
        if len(q) >= self.app_rate or (uq is not None and len(uq) >= self.user_rate):
            self.rejected_429 += 1
            return True
        q.append(now)
        if uq is not None:
            uq.append(now)
        return False

    async def _common(self, request: web.Request, op: str, user: str | None) -> web.Response | str | None:
        """Apply auth, faults and limits; return a response to send instead, or the fault kind to finish with."""
        self.connections.add(request.transport.get_extra_info("peername") if request.transport else None)
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or auth[7:] not in self.tokens:
            return self._json(99991663,
                              "Invalid access token for authorization. Please make a request with token attached.")
        kind = self._fault(op)
        if kind == "slow":
            await asyncio.sleep(self.slow_s)
            kind = None
        if kind == "5xx":
            return self._json(1500, "internal error", status=500)
        if kind == "nonjson":
            return web.Response(status=502, text="<html>bad gateway</html>", content_type="text/html")
        if kind == "429":
            return self._json(99991400, "request trigger frequency limit", status=429,
                              headers={"x-ogw-ratelimit-reset": "7"})
        if kind in ("230013", "230053", "230020", "230031", "230011", "230110"):
            msgs = {"230013": "Bot has NO availability to this user.",
                    "230053": "The user has stopped the bot from sending messages.",
                    "230020": "This operation triggers the frequency limit.",
                    "230031": "The message is too old to be updated.",
                    "230011": "The message was recalled.",
                    "230110": "Action unavailable as the message has been deleted."}
            status = 400
            return self._json(int(kind), msgs[kind], status=status)
        if self._limited(user, self.token_app.get(auth[7:])):
            return self._json(99991400, "request trigger frequency limit", status=429,
                              headers={"x-ogw-ratelimit-reset": "1"})
        return kind  # None or "lost"

    def _note_uuid(self, uuid: str | None) -> None:
        if uuid:
            self._repeats += uuid in self._seen_uuids
            self._seen_uuids.add(uuid)

    def _accept(self, uuid: str | None, receive_id: str | None, content: str, reply_to: str | None) -> Message:
        now = self.now()
        if uuid and uuid in self._by_uuid:
            mid, at = self._by_uuid[uuid]
            if now - at < self.dedup_window_s:
                return self.messages[mid]
        mid = f"om_{next(_counter):08d}{int(now) % 1000:03d}"
        try:
            card = json.loads(content)
        except (TypeError, ValueError):
            card = {"raw": content}
        m = Message(message_id=mid, receive_id=receive_id, uuid=uuid, content=card, at=now, reply_to=reply_to)
        self.messages[mid] = m
        self.sent.append(m)
        if uuid:
            self._by_uuid[uuid] = (mid, now)
        return m

    def _data(self, m: Message) -> dict:
        return {"message_id": m.message_id, "msg_type": "interactive", "create_time": str(int(m.at * 1000)),
                "chat_id": f"oc_{m.receive_id or 'thread'}"}

    async def _user(self, request: web.Request) -> web.Response:
        """`GET /open-apis/contact/v3/users/{open_id}?user_id_type=open_id`: a known user's name, else 41050."""
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or auth[7:] not in self.tokens:
            return self._json(99991663, "Invalid access token for authorization.")
        open_id = request.match_info["user_id"]
        self.contact_lookups.append(open_id)
        if request.query.get("user_id_type") != "open_id" or open_id not in self.users:
            return self._json(41050, "no user authority error", status=400)
        return self._json(0, data={"user": {"open_id": open_id, "name": self.users[open_id]}})

    async def _send(self, request: web.Request) -> web.Response:
        if request.query.get("receive_id_type") != "open_id":
            return self._json(230001, "receive_id_type must be open_id here")
        body = await request.json()
        self._note_uuid(body.get("uuid"))
        self.requests.append(("send", body.get("uuid"), body))
        res = await self._common(request, "send", body.get("receive_id"))
        if isinstance(res, web.Response):
            return res
        m = self._accept(body.get("uuid"), body.get("receive_id"), body.get("content"), None)
        if res == "lost":
            return web.Response(status=502, text="upstream reset")
        return self._json(0, data=self._data(m))

    async def _reply(self, request: web.Request) -> web.Response:
        target = request.match_info["message_id"]
        body = await request.json()
        self._note_uuid(body.get("uuid"))
        self.requests.append(("reply", body.get("uuid"), body))
        res = await self._common(request, "reply", None)
        if isinstance(res, web.Response):
            return res
        if target not in self.messages:
            return self._json(230011, "The message was recalled.", status=400)
        m = self._accept(body.get("uuid"), None, body.get("content"), target)
        return self._json(0, data=self._data(m))

    async def _patch(self, request: web.Request) -> web.Response:
        target = request.match_info["message_id"]
        body = await request.json()
        self.requests.append(("patch", target, body))
        res = await self._common(request, "patch", None)
        if isinstance(res, web.Response):
            return res
        m = self.messages.get(target)
        if m is None:
            return self._json(230110, "Action unavailable as the message has been deleted.", status=400)
        if self.now() - m.at >= 14 * 86400:
            return self._json(230031, "The message is too old to be updated.", status=400)
        card = json.loads(body.get("content") or "{}")
        m.updates.append(card)
        self.patches.append((target, card))
        return self._json(0)


def clock_seconds(clock: Any) -> Callable[[], float]:
    """Adapt the hub's injected clock to the fake's `now` (epoch seconds)."""
    return lambda: clock.now().timestamp()


def card_text(card: dict, lang: str = "en_us") -> str:
    """Return the visible text of a rendered card in one language (for assertions)."""
    parts = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "i18n_content" in node and isinstance(node["i18n_content"], dict):
                parts.append(node["i18n_content"].get(lang, ""))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(card)
    return "\n".join(parts)


__all__ = ["FakeFeishu", "Message", "clock_seconds", "card_text", "datetime"]


async def _serve(app_ids: str, port: int, limits: bool) -> None:
    first, *more = app_ids.split(",")
    fake = await FakeFeishu(first, limits=limits, more_apps={a: "secret" for a in more}).start(port)
    print(fake.base_url, flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":  # a fake in its own process, as the real platform would be (used by bench/outbox)
    import sys  # python -m tests.fakes.feishu APP_ID[,APP_ID…] PORT [--limits]

    asyncio.run(_serve(sys.argv[1], int(sys.argv[2]), "--limits" in sys.argv))


def card_buttons(card: dict) -> list[dict]:
    """Return every button node of a rendered card, in order (its `text` and `behaviors[0]["value"]`)."""
    found: list[dict] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("tag") == "button":
                found.append(node)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(card)
    return found


def signed_card_callback(*, app_id: str, open_id: str, value: dict, message_id: str, now_s: float,
                         token: str, encrypt_key: str) -> tuple[bytes, dict[str, str]]:
    """Build a `card.action.trigger` callback the way Feishu sends it: encrypted body and signed headers."""
    import os
    import uuid

    from bot.feishu.webhook import encrypt, signature

    event = {"operator": {"tenant_key": "t1", "open_id": open_id, "union_id": f"on_{open_id[3:]}"},
             "token": f"c-{uuid.uuid4().hex}", "action": {"value": value, "tag": "button"}, "host": "im_message",
             "context": {"open_message_id": message_id, "open_chat_id": f"oc_{open_id}"}}
    envelope = {"schema": "2.0", "header": {
        "event_id": uuid.uuid4().hex, "token": token, "event_type": "card.action.trigger", "tenant_key": "t1",
        "app_id": app_id, "create_time": str(int(now_s * 1000))}, "event": event}
    body = json.dumps({"encrypt": encrypt(json.dumps(envelope), encrypt_key, os.urandom(16))}).encode()
    ts, nonce = str(int(now_s)), uuid.uuid4().hex
    return body, {"Content-Type": "application/json", "X-Lark-Request-Timestamp": ts, "X-Lark-Request-Nonce": nonce,
                  "X-Lark-Signature": signature(ts, nonce, encrypt_key, body)}
