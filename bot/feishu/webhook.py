"""`POST /feishu/{app_id}/events`: Feishu's event subscription (messages and card callbacks).

Order of checks (lark-oapi's own, plus a freshness window): decrypt `{"encrypt": …}` with lark-oapi's
`AESCipher` (AES-256-CBC, key = sha256(encrypt_key), iv = first block); answer the URL-verification challenge after
the verification token matches; verify `X-Lark-Signature` = sha256(timestamp + nonce + encrypt_key + body)
when an encrypt key is set; check the verification token in the header; refuse a request whose timestamp
is outside the window (replays), then hand the event to the bot, which deduplicates on event_id.
The answer is sent at once; slow work (a reply, a Turn) runs after it. Why the rest is not lark-oapi's
`EventDispatcherHandler`: docs/dependencies.md.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import logging
from typing import Any, Awaitable, Callable, Mapping, Protocol

from aiohttp import web
from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from hub.config import FeishuAppSettings

log = logging.getLogger(__name__)
MAX_BODY = 1024 * 1024
FRESH_S = 300.0


class Inbound(Protocol):
    """Where the Feishu doors (this webhook, the long connections) hand each event: the bot (bot.core.FeishuBot)."""

    @property
    def apps(self) -> Mapping[str, FeishuAppSettings]:
        """The configured applications by app_id."""
        ...

    async def accept(self, app_id: str, envelope: dict) -> tuple[dict, Awaitable | None]:
        """Deduplicate and route one event; return (the immediate answer, slow work to run after it)."""
        ...

    def spawn(self, work: Awaitable[Any]) -> Any:
        """Run slow work after the answer was sent; kept referenced until done."""
        ...


class Rejected(Exception):
    """The request is not from Feishu (or no longer fresh): answered 401/400, nothing happens."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def signature(timestamp: str, nonce: str, encrypt_key: str, body: bytes) -> str:
    """Return Feishu's `X-Lark-Signature` of a request."""
    return hashlib.sha256((timestamp + nonce + encrypt_key).encode() + body).hexdigest()


def decrypt(encrypt: str, encrypt_key: str) -> str:
    """Decrypt an `encrypt` field with lark-oapi's own `AESCipher` (base64 of iv + AES-256-CBC ciphertext, key
    sha256(encrypt_key), PKCS#7); ValueError or TypeError when it does not decrypt."""
    from lark_oapi.core.utils.decryptor import AESCipher  # only a configured app needs lark-oapi (its import is big)

    return AESCipher(encrypt_key).decrypt_str(encrypt)


def encrypt(plaintext: str, encrypt_key: str, iv: bytes) -> str:
    """Encrypt like Feishu does (for tests and the console)."""
    key = hashlib.sha256(encrypt_key.encode()).digest()
    pad = padding.PKCS7(128).padder()
    data = pad.update(plaintext.encode()) + pad.finalize()
    enc = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
    return base64.b64encode(iv + enc.update(data) + enc.finalize()).decode()


def _same(a: Any, b: str) -> bool:
    return isinstance(a, str) and hmac.compare_digest(a.encode(), b.encode())


def open_request(app: Any, headers: Any, body: bytes, now_s: float, window_s: float = FRESH_S) -> dict:
    """Authenticate and decode one request (pure: no I/O); return the event envelope or a challenge.

    Raises Rejected. Returns `{"challenge": …}` for the URL verification.
    """
    try:
        outer = json.loads(body)
    except ValueError:
        raise Rejected(400, "body is not JSON") from None
    if not isinstance(outer, dict):
        raise Rejected(400, "body is not a JSON object")
    data = outer
    if "encrypt" in outer:
        if not app.encrypt_key:
            raise Rejected(400, "encrypted body but no encrypt_key is configured for this application")
        try:
            data = json.loads(decrypt(outer["encrypt"], app.encrypt_key))
        except (ValueError, TypeError):
            raise Rejected(401, "body does not decrypt with this application's encrypt_key") from None
    if not isinstance(data, dict):
        raise Rejected(400, "event is not a JSON object")
    if data.get("type") == "url_verification":
        if not app.verification_token or not _same(data.get("token"), app.verification_token):
            raise Rejected(401, "verification token does not match")
        return {"challenge": data.get("challenge")}
    ts, nonce, sig = (headers.get("X-Lark-Request-Timestamp"), headers.get("X-Lark-Request-Nonce"),
                      headers.get("X-Lark-Signature"))
    if app.encrypt_key:
        if not (ts and nonce and sig) or not _same(sig, signature(ts, nonce, app.encrypt_key, body)):
            raise Rejected(401, "signature verification failed")
    elif not app.verification_token:
        raise Rejected(403, "this application has neither encrypt_key nor verification_token; configure one")
    header = data.get("header") or {}
    if not isinstance(header, dict):
        raise Rejected(400, "event header is not a JSON object")
    token = header.get("token") if header else data.get("token")
    if app.verification_token and not _same(token, app.verification_token):
        raise Rejected(401, "verification token does not match")
    created = _seconds(header.get("create_time"), 1000.0)
    if app.encrypt_key:  # the signed header timestamp is the request's own
        sent = _seconds(ts, 1.0)
    else:
        # Token-only: nothing signs the header timestamp, so freshness comes from the event's own creation
        # time; a header timestamp, when sent, must agree with it (a fresh header on a stale event is a replay).
        sent = created
        if sent is not None and ts is not None:
            header_ts = _seconds(ts, 1.0)
            if header_ts is None or abs(header_ts - sent) > window_s:
                raise Rejected(401, "X-Lark-Request-Timestamp disagrees with the event's create_time (a replay?)")
    if sent is None:
        raise Rejected(401, "request has no usable timestamp (header.create_time, or a signed "
                            "X-Lark-Request-Timestamp); token-only applications need schema 2.0 events")
    if abs(now_s - sent) > window_s:
        raise Rejected(401, "request timestamp is outside the freshness window (a replay?)")
    return data


def _seconds(value: Any, per_second: float) -> float | None:
    """Parse a timestamp (seconds, or milliseconds with per_second=1000); None when absent or not a finite number."""
    try:
        seconds = float(value) / per_second
    except (TypeError, ValueError):
        return None
    return seconds if math.isfinite(seconds) else None


class WebhookEndpoint:
    """The aiohttp handler for every configured application."""

    def __init__(self, bot: Inbound, now_s: Callable[[], float], window_s: float = FRESH_S) -> None:
        self.bot = bot
        self.now_s = now_s
        self.window_s = window_s

    async def handle(self, request: web.Request) -> web.Response:
        """Answer one Feishu request (within 3 s; slow work is spawned)."""
        app = self.bot.apps.get(request.match_info["app_id"])
        if app is None or app.mode != "webhook":
            return web.json_response({"error": "unknown application; add it under [[feishu.apps]] (mode webhook)"},
                                     status=404)
        if request.content_length and request.content_length > MAX_BODY:
            return web.json_response({"error": "body too large"}, status=413)
        body = await request.read()
        try:
            data = open_request(app, request.headers, body, self.now_s(), self.window_s)
        except Rejected as e:
            log.warning("Feishu request to %s refused: %s", app.app_id, e)
            return web.json_response({"error": str(e)}, status=e.status)
        if "challenge" in data:
            return web.json_response({"challenge": data["challenge"]})
        answer, work = await self.bot.accept(app.app_id, data)
        if work is not None:
            self.bot.spawn(work)
        return web.json_response(answer)


def add_routes(app: web.Application, endpoint: WebhookEndpoint) -> None:
    """Mount the event subscription."""
    app.router.add_post("/feishu/{app_id}/events", endpoint.handle)
