"""Long-connection mode: `lark.ws.Client` per application, in its own thread with its own event loop.

lark-oapi's ws client keeps a module-level loop and calls `run_until_complete` on it, so it cannot start
inside the hub's running loop: each client gets a thread and a fresh loop. Only one hub replica holds
an application's connection at a time: a lease row `bot_leases("longconn:<app_id>")` is claimed and
renewed by the holder; a crashed holder's lease expires and another replica takes over. Events are
handed to the hub loop (`run_coroutine_threadsafe`) and go through `FeishuBot.accept` like webhook events.
"""
from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
from datetime import timedelta
from typing import Any, Callable

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from hub.store.tables import bot_leases

log = logging.getLogger(__name__)
LEASE_S = 30.0


class LongConnections:
    """Hold the long connections of the applications configured with `mode = "long-connection"`."""

    def __init__(self, bot: Any, hub: Any, *, lease_s: float = LEASE_S, holder: str | None = None,
                 starter: Callable[[Any, asyncio.AbstractEventLoop], None] | None = None) -> None:
        self.bot = bot
        self.hub = hub
        self.lease_s = lease_s
        self.holder = holder or f"replica-{secrets.token_hex(4)}"
        self.starter = starter or self._start_thread
        self.apps = [a for a in bot.apps.values() if a.mode == "long-connection"]
        self.running: set[str] = set()
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        """Start one lease keeper per long-connection application."""
        for app in self.apps:
            self._tasks.append(asyncio.ensure_future(self._keep(app)))

    async def stop(self) -> None:
        """Stop the keepers and release held leases (the ws threads are daemons and end with the process)."""
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        async with self.hub.db.write() as conn:
            await conn.execute(bot_leases.delete().where(bot_leases.c.holder == self.holder))

    async def claim(self, app_id: str) -> bool:
        """Claim or renew the lease of `app_id`; True when this replica holds it."""
        now = self.hub.clock.now()
        name = f"longconn:{app_id}"
        until = now + timedelta(seconds=self.lease_s)
        try:
            async with self.hub.db.write() as conn:
                row = (await conn.execute(self.hub.db.for_update(sa.select(bot_leases).where(bot_leases.c.name == name)))).first()
                if row is None:
                    await conn.execute(bot_leases.insert().values(name=name, holder=self.holder, expires_at=until))
                    return True
                expires = row.expires_at if row.expires_at.tzinfo else row.expires_at.replace(tzinfo=now.tzinfo)
                if row.holder != self.holder and expires > now:
                    return False
                await conn.execute(bot_leases.update().where(bot_leases.c.name == name)
                                   .values(holder=self.holder, expires_at=until))
                return True
        except IntegrityError:
            return False

    async def _keep(self, app: Any) -> None:
        while True:
            try:
                if await self.claim(app.app_id) and app.app_id not in self.running:
                    self.running.add(app.app_id)
                    self.starter(app, asyncio.get_running_loop())
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 — keep trying; the lease simply expires meanwhile
                log.exception("long-connection lease of %s failed", app.app_id)
            await asyncio.sleep(self.lease_s / 3)

    def _start_thread(self, app: Any, hub_loop: asyncio.AbstractEventLoop) -> None:
        threading.Thread(target=self._run, args=(app, hub_loop), name=f"lark-ws-{app.app_id}", daemon=True).start()

    def _run(self, app: Any, hub_loop: asyncio.AbstractEventLoop) -> None:
        import lark_oapi as lark
        import lark_oapi.ws.client as ws_client

        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        ws_client.loop = loop  # the SDK's module-level loop; this thread owns it
        client = lark.ws.Client(app.app_id, app.app_secret, event_handler=self.event_handler(app, hub_loop),
                                domain=app.base_url.rstrip("/"), log_level=lark.LogLevel.WARNING)
        client.start()

    def event_handler(self, app: Any, hub_loop: asyncio.AbstractEventLoop) -> Any:
        """Return the SDK dispatcher that hands each event frame to `FeishuBot.accept` on the hub loop.

        Called from the connection's own thread: it blocks that thread (never the hub loop) for the answer.
        """
        import lark_oapi as lark
        from lark_oapi.event.callback.model.p2_card_action_trigger import P2CardActionTriggerResponse

        def hand_over(data: Any) -> dict:
            envelope = json.loads(lark.JSON.marshal(data))
            fut = asyncio.run_coroutine_threadsafe(self.bot.accept(app.app_id, envelope), hub_loop)
            answer, work = fut.result(timeout=3)
            if work is not None:
                hub_loop.call_soon_threadsafe(self.bot.spawn, work)
            return answer

        return (lark.EventDispatcherHandler.builder("", "")
                .register_p2_im_message_receive_v1(lambda d: hand_over(d) and None)
                .register_p2_card_action_trigger(lambda d: P2CardActionTriggerResponse(hand_over(d)))
                .build())
