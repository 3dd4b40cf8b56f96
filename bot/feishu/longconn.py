"""Long-connection mode: `lark.ws.Client` per application, in its own thread with its own event loop.

lark-oapi's ws client runs on a module-level `loop` (`run_until_complete`, `create_task`), so it cannot start
inside the hub's running loop: each client gets a thread and a fresh loop, and the module-level name is replaced
once by `ThreadLoops`, which answers each thread with the loop that thread bound (assigning the module global
from every thread made the last thread's loop serve every client).

Only one hub replica holds an application's connection at a time: a lease row `bot_leases("longconn:<app_id>")`
is claimed and renewed by the holder's keeper (a supervised loop, every `lease_s / 3`). A keeper that finds the
lease held by another replica, or that could not renew it before it expired, stops its client thread; a crashed
holder's lease expires and another replica takes over. Events are handed to the hub loop
(`run_coroutine_threadsafe`) and go through `FeishuBot.accept` like webhook events.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import threading
from datetime import datetime, timedelta
import functools
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Protocol

from hub.config import FeishuAppSettings
from hub.loops import Loops
from hub.services.chat.bot import BotService

from .webhook import Inbound

if TYPE_CHECKING:
    from bot.services import BotServices

log = logging.getLogger(__name__)


@functools.cache
def closable_client(lark: Any) -> type:
    """`lark.ws.Client` with a `close()`: the SDK offers `start()` and nothing to stop it, so this subclass closes
    the websocket through the client's own `_disconnect` (a known limit, in docs/bot.md; an upgrade that renames it
    fails `tests/integration/test_feishu_longconn.py`, which checks that a stopped client's connection closes)."""

    class ClosableClient(lark.ws.Client):
        async def close(self) -> None:
            await self._disconnect()

    return ClosableClient


LEASE_S = 30.0
STOP_WAIT_S = 5.0  # how long `stop` waits for a client thread (an event handler may block it for up to 3 s)
INSTALL = threading.Lock()


class Link(Protocol):
    """A running client of one application, as the keeper sees it."""

    def alive(self) -> bool:
        """Say whether the client still runs."""

    def stop(self) -> None:
        """Ask the client to close its connection and end (returns at once)."""

    def join(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the client to end (blocking: call it from a thread)."""


Starter = Callable[[FeishuAppSettings, asyncio.AbstractEventLoop], Link | None]


class ThreadLoops:
    """Stand-in for lark-oapi's module-level `loop`: each thread sees the loop it bound, others the original."""

    def __init__(self, default: asyncio.AbstractEventLoop) -> None:
        self._default = default
        self._local = threading.local()

    def bind(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Make `loop` this thread's answer (None: back to the original)."""
        self._local.loop = loop

    def __getattr__(self, name: str) -> Any:
        return getattr(getattr(self._local, "loop", None) or self._default, name)


def thread_loops() -> ThreadLoops:
    """Install `ThreadLoops` as `lark_oapi.ws.client.loop` (once per process) and return it."""
    import lark_oapi.ws.client as ws_client

    with INSTALL:
        if not isinstance(ws_client.loop, ThreadLoops):
            ws_client.loop = ThreadLoops(ws_client.loop)
        return ws_client.loop


class ClientThread:
    """One application's lark-oapi client on its own thread and event loop; `stop()` closes both."""

    def __init__(self, app: FeishuAppSettings, handler: Any) -> None:
        self.app = app
        self.handler = handler
        self.thread = threading.Thread(target=self._run, name=f"lark-ws-{app.app_id}", daemon=True)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False

    def start(self) -> ClientThread:
        """Start the thread."""
        self.thread.start()
        return self

    def alive(self) -> bool:
        """Say whether the thread still runs."""
        return self.thread.is_alive()

    def stop(self) -> None:
        """Cancel everything on the client's loop (its connection closes, it does not reconnect)."""
        with self._lock:
            self._stopping = True
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._cancel_all)

    def join(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the thread to end."""
        self.thread.join(timeout)

    def _cancel_all(self) -> None:
        with self._lock:
            if self._loop is None:  # the thread is cleaning up already
                return
            for task in asyncio.all_tasks(self._loop):
                task.cancel()

    def _run(self) -> None:
        import lark_oapi as lark

        loop = asyncio.new_event_loop()
        with self._lock:
            if self._stopping:
                loop.close()
                return
            self._loop = loop
        asyncio.set_event_loop(loop)
        loops = thread_loops()
        loops.bind(loop)
        client = None
        try:
            client = closable_client(lark)(self.app.app_id, self.app.app_secret, event_handler=self.handler,
                                           domain=self.app.base_url.rstrip("/"), log_level=lark.LogLevel.WARNING)
            client.start()
        except asyncio.CancelledError:
            log.info("long connection of %s stopped", self.app.app_id)
        except Exception:  # the thread ends; the keeper starts another while it holds the lease
            log.exception("long connection of %s ended", self.app.app_id)
        finally:
            with self._lock:
                self._loop = None  # from here on `stop` and `_cancel_all` leave the loop alone
            self._close(loop, client)
            loops.bind(None)

    @staticmethod
    def _close(loop: asyncio.AbstractEventLoop, client: Any) -> None:
        if client is not None:
            with contextlib.suppress(BaseException):
                loop.run_until_complete(asyncio.wait_for(client.close(), 2.0))
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()


class LongConnections:
    """Hold the long connections of the applications configured with `mode = "long-connection"`."""

    def __init__(self, bot: Inbound, services: BotServices, *, lease_s: float = LEASE_S, holder: str | None = None,
                 starter: Starter | None = None, service: BotService | None = None) -> None:
        self.bot = bot
        self.clock = services.clock
        self.lease_s = lease_s
        self.holder = holder or f"{socket.gethostname()[:60]}:{os.getpid()}:{secrets.token_hex(4)}"
        self.starter = starter or self.start_client
        self.service = service or services.state
        self.apps = [a for a in bot.apps.values() if a.mode == "long-connection"]
        self.links: dict[str, Link | None] = {}      # app_id → the client this replica runs
        self.held_until: dict[str, datetime] = {}    # app_id → when this replica's lease ends (its own clock)
        self.loops = Loops(backoff_max_s=max(lease_s / 3, 0.1))

    @property
    def running(self) -> set[str]:
        """The applications whose client this replica runs."""
        return set(self.links)

    def start(self) -> None:
        """Start one lease keeper per long-connection application (a supervised loop each)."""
        for app in self.apps:
            self.loops.start(f"longconn:{app.app_id}", partial(self.keep, app), interval_s=self.lease_s / 3)

    async def stop(self) -> None:
        """Stop the keepers, close this replica's clients and release its leases (another replica takes over
        without waiting for them to expire)."""
        await self.loops.stop()
        for app_id in list(self.links):
            await self._drop(app_id, "the replica stops")
        await self.service.release_leases(self.holder)

    async def claim(self, app_id: str) -> bool:
        """Claim or renew the lease of `app_id`; True when this replica holds it."""
        now = self.clock.now()
        held = await self.service.claim_lease(f"longconn:{app_id}", self.holder, self.lease_s)
        if held:
            self.held_until[app_id] = now + timedelta(seconds=self.lease_s)
        else:
            self.held_until.pop(app_id, None)
        return held

    async def keep(self, app: FeishuAppSettings) -> None:
        """One keeper pass: renew (or take) the lease; run the client while it is ours, stop it when it is not
        (held by another replica, or not renewed before it expired)."""
        app_id = app.app_id
        try:
            held = await self.claim(app_id)
        except Exception:
            until = self.held_until.get(app_id)
            if app_id in self.links and (until is None or self.clock.now() >= until):
                await self._drop(app_id, "its lease expired before it could be renewed")
            raise  # the supervisor logs it, counts it and tries again
        if not held:
            if app_id in self.links:
                await self._drop(app_id, "another replica holds its lease")
            return
        if app_id not in self.links or not _alive(self.links[app_id]):
            self.links[app_id] = self.starter(app, asyncio.get_running_loop())

    async def _drop(self, app_id: str, why: str) -> None:
        link = self.links.pop(app_id, None)
        if link is None:
            return
        log.warning("closing the long connection of %s: %s", app_id, why)
        link.stop()
        await asyncio.to_thread(link.join, STOP_WAIT_S)

    def start_client(self, app: FeishuAppSettings, hub_loop: asyncio.AbstractEventLoop) -> ClientThread:
        """Start `app`'s lark-oapi client on a thread of its own, handing its events to `hub_loop`."""
        return ClientThread(app, self.event_handler(app, hub_loop)).start()

    def event_handler(self, app: FeishuAppSettings, hub_loop: asyncio.AbstractEventLoop) -> Any:
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
                hub_loop.call_soon_threadsafe(self.bot.spawn, work)  # the bot keeps a reference until it ends
            return answer

        return (lark.EventDispatcherHandler.builder("", "")
                .register_p2_im_message_receive_v1(lambda d: hand_over(d) and None)
                .register_p2_card_action_trigger(lambda d: P2CardActionTriggerResponse(hand_over(d)))
                .build())


def _alive(link: Link | None) -> bool:
    return link is None or link.alive()  # a starter that returns nothing is taken to run until stopped
