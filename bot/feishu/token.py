"""Tenant access tokens, fetched and refreshed without blocking the event loop.

lark-oapi's async calls fetch the token with a blocking request inside the loop and cache it per app_id
process-wide; the hub instead fetches it here with aiohttp, over the application's shared session
(bot.feishu.transport) when it is given one, and passes it per request.
"""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import aiohttp

if TYPE_CHECKING:
    from .transport import AppTransport

TOKEN_PATH = "/open-apis/auth/v3/tenant_access_token/internal"
REFRESH_MARGIN_S = 300  # Feishu hands out a fresh token during the last 30 minutes; refresh well before expiry


class TokenError(Exception):
    """The token endpoint refused or could not be reached (a transient delivery failure)."""


class TenantToken:
    """One application's tenant access token."""

    def __init__(self, base_url: str, app_id: str, app_secret: str, timeout_s: float = 10.0,
                 http: "AppTransport | None" = None) -> None:
        self.url = base_url.rstrip("/") + TOKEN_PATH
        self.http = http
        self.app_id = app_id
        self.app_secret = app_secret
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._token: str | None = None
        self._expires = 0.0
        self._lock = asyncio.Lock()
        self.fetches = 0

    async def get(self) -> str:
        """Return a valid token, fetching one when missing or close to expiry."""
        if self._token and time.monotonic() < self._expires - REFRESH_MARGIN_S:
            return self._token
        async with self._lock:
            if self._token and time.monotonic() < self._expires - REFRESH_MARGIN_S:
                return self._token
            return await self._fetch()

    def invalidate(self, token: str | None = None) -> None:
        """Forget the token (the platform said 99991663: invalid or expired)."""
        if token is None or token == self._token:
            self._token = None

    async def _request(self) -> Any:
        creds = {"app_id": self.app_id, "app_secret": self.app_secret}
        if self.http is not None:
            return await self.http.post_json(TOKEN_PATH, creds)
        async with aiohttp.ClientSession(timeout=self.timeout) as s:
            async with s.post(self.url, json=creds) as r:
                return await r.json(content_type=None)

    async def _fetch(self) -> str:
        try:
            body = await self._request()
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            raise TokenError(f"tenant token request failed: {type(e).__name__}: {e}") from e
        if not isinstance(body, dict) or body.get("code") != 0 or not body.get("tenant_access_token"):
            raise TokenError(f"tenant token refused: {body!r:.200}")
        token: str = body["tenant_access_token"]
        self._token = token
        self._expires = time.monotonic() + float(body.get("expire", 7200))
        self.fetches += 1
        return token
