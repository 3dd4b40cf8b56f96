"""The bot's piece of the composition root: routes (webhook, console) and lifespan (background work)."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, AsyncIterator

from aiohttp import web

from hub.errors import Invalid

from . import console
from .core import FeishuBot
from .feishu import webhook
from .feishu.longconn import LongConnections

if TYPE_CHECKING:
    from .services import BotServices

LARK_FIX = "install it with `pip install 'lark-oapi>=1.4'` (a dependency of amux-hub: reinstalling amux-hub brings it)"


def require_lark(why: str) -> None:
    """Refuse to start, naming the fix, when lark-oapi cannot be imported but `why` needs it."""
    try:
        importlib.import_module("lark_oapi.ws.client")  # only when an application needs it (thousands of modules)
    except ImportError as e:
        raise Invalid(f"{why} needs lark-oapi, which cannot be imported ({e}); {LARK_FIX}") from e


class BotApp:
    """The bot wired into one hub replica."""

    def __init__(self, services: BotServices) -> None:
        self.services = services
        self.core = FeishuBot(services)
        self.webhook = webhook.WebhookEndpoint(self.core, lambda: services.clock.now().timestamp())
        feishu = services.feishu
        long_apps = [a.app_id for a in feishu.apps if a.mode == "long-connection"]
        if long_apps:
            require_lark(f"Feishu application {', '.join(long_apps)} (mode = \"long-connection\")")
        self.longconn = LongConnections(self.core, services,
                                        lease_s=feishu.long_connection_lease_s) if long_apps else None

    def add_routes(self, app: web.Application) -> None:
        """Mount `POST /feishu/{app_id}/events` and the local console."""
        webhook.add_routes(app, self.webhook)
        console.add_routes(app, self.core, self.services)

    async def lifespan(self, _app: web.Application) -> AsyncIterator[None]:
        """Own the bot's background work, its long connections and the alert channel for the app's lifetime."""
        if self.longconn is not None:
            self.longconn.start()
        try:
            yield
        finally:
            if self.longconn is not None:
                await self.longconn.stop()
            await self.core.aclose()


def build_bot(services: BotServices) -> BotApp:
    """Build the bot over `services` (called by the composition root, hub/app.py)."""
    return BotApp(services)
