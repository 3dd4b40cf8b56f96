"""The bot's piece of the composition root: routes (webhook, console) and lifespan (background work)."""
from __future__ import annotations

from typing import Any, AsyncIterator

from aiohttp import web

from .core import FeishuBot
from .feishu import webhook


class BotApp:
    """The bot wired into one hub replica."""

    def __init__(self, hub: Any) -> None:
        self.hub = hub
        self.core = FeishuBot(hub)
        self.webhook = webhook.WebhookEndpoint(self.core, lambda: hub.clock.now().timestamp())

    def add_routes(self, app: web.Application) -> None:
        """Mount `POST /feishu/{app_id}/events` and the local console."""
        webhook.add_routes(app, self.webhook)
        try:
            from . import console
        except ImportError:  # pragma: no cover — the console is optional
            return
        console.add_routes(app, self.core, self.hub)

    async def lifespan(self, _app: web.Application) -> AsyncIterator[None]:
        """Own the bot's background work (and long connections) for the app's lifetime."""
        longconn = None
        try:
            from .feishu.longconn import LongConnections
            longconn = LongConnections(self.core, self.hub)
            longconn.start()
        except ImportError:  # pragma: no cover
            longconn = None
        yield
        if longconn is not None:
            await longconn.stop()
        await self.core.aclose()


def build_bot(hub: Any) -> BotApp:
    """Build the bot for `hub` (called by hub.app.Hub)."""
    return BotApp(hub)
