"""Feishu users' display names (contact API `GET /open-apis/contact/v3/users/{open_id}`), for greetings only.

A name is looked up over lark-oapi's request model on the application's own HTTP client with the hub-managed
tenant token, and kept for `ttl_s` in this process: it is shown, never used to decide anything. A failed lookup
(the app lacks the contact permission, a timeout, an unknown user) answers None and the card greets without it.
lark-oapi is imported on the first lookup, so a hub without Feishu apps never imports it.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Iterable

from hub.config import FeishuAppSettings

log = logging.getLogger(__name__)


class FeishuDirectory:
    """Look up the display name of a Feishu user of one of the configured applications."""

    def __init__(self, apps: Iterable[FeishuAppSettings], timeout_s: float = 1.5, ttl_s: float = 3600.0) -> None:
        self.settings = {a.app_id: a for a in apps}
        self.timeout_s = timeout_s
        self.ttl_s = ttl_s
        self._apps: dict[str, tuple[Any, Any]] = {}
        self._names: dict[tuple[str, str], tuple[str | None, float]] = {}

    def _app(self, app_id: str) -> tuple[Any, Any] | None:
        if app_id not in self._apps:
            a = self.settings.get(app_id)
            if a is None:
                return None
            from .token import TenantToken
            from .transport import AppTransport

            http = AppTransport(a.base_url, self.timeout_s)
            self._apps[app_id] = (http, TenantToken(a.base_url, a.app_id, a.app_secret, self.timeout_s, http=http))
        return self._apps[app_id]

    async def name(self, app_id: str, open_id: str) -> str | None:
        """Return the user's display name, or None when Feishu does not give it (within `timeout_s`)."""
        key = (app_id, open_id)
        hit = self._names.get(key)
        if hit is not None and hit[1] > time.monotonic():
            return hit[0]
        try:
            name = await asyncio.wait_for(self._lookup(app_id, open_id), self.timeout_s)
        except Exception as e:  # noqa: BLE001 — a greeting without the name, never a failed card
            log.info("no display name for %s in %s: %s", open_id, app_id, type(e).__name__)
            name = None
        self._names[key] = (name, time.monotonic() + (self.ttl_s if name else 60.0))
        return name

    async def _lookup(self, app_id: str, open_id: str) -> str | None:
        app = self._app(app_id)
        if app is None:
            return None
        from lark_oapi.api.contact.v3 import GetUserRequest, GetUserResponse

        http, token = app
        req = GetUserRequest.builder().user_id(open_id).user_id_type("open_id").build()
        resp = await http.call(req, await token.get(), GetUserResponse)
        if resp.code != 0:
            log.info("Feishu contact lookup answered %s %s", resp.code, resp.msg)
            return None
        user = getattr(resp.data, "user", None)
        return (getattr(user, "name", None) or None) if user is not None else None

    async def aclose(self) -> None:
        """Close the HTTP clients."""
        for http, _token in self._apps.values():
            await http.aclose()
