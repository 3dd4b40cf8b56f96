"""The aiohttp server with limits for slow and idle clients (aiohttp itself has no request-head timeout).

- A request head must arrive within `header_timeout_s` of the connection opening or of the previous
  response (a keep-alive connection idle that long is closed too); a slowloris never finishes one.
- At most `max_pending_connections` connections may be waiting for a request head at once; past
  that, new ones are closed at once (an authenticated client's request in flight is not counted).
- Bodies must arrive within `body_timeout_s` (the edge middleware reads them: 408).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server


@dataclass(frozen=True, kw_only=True)
class ConnectionLimits:
    """The numbers (settings `hub.header_timeout_s`, `hub.max_pending_connections`)."""

    header_timeout_s: float = 15.0
    max_pending_connections: int = 512


class GuardedRequestHandler(RequestHandler):
    """A request handler that closes connections which do not deliver a request head in time."""

    def __init__(self, manager: "GuardedServer", **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._amux_server = manager
        self._amux_timer: asyncio.TimerHandle | None = None

    def amux_arm(self) -> None:
        """Start waiting for the next request head (at connection start, and after each response)."""
        self.amux_disarm()
        if self._messages:  # the next request head is already here (pipelining)
            return
        self._amux_server.pending.add(self)
        self._amux_timer = self._loop.call_later(self._amux_server.limits.header_timeout_s, self._amux_expire)

    def amux_disarm(self) -> None:
        """Stop waiting: a request head arrived, or the connection is gone."""
        if self._amux_timer is not None:
            self._amux_timer.cancel()
            self._amux_timer = None
        self._amux_server.pending.discard(self)

    def _amux_expire(self) -> None:
        self._amux_timer = None
        self._amux_server.pending.discard(self)
        self._amux_server.closed_slow += 1
        if self.transport is not None:
            self.transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # noqa: D102
        super().connection_made(transport)
        if len(self._amux_server.pending) >= self._amux_server.limits.max_pending_connections:
            self._amux_server.refused += 1
            transport.close()
            return
        self.amux_arm()

    def data_received(self, data: bytes) -> None:  # noqa: D102
        super().data_received(data)
        if self._amux_timer is not None and self._messages:  # a whole request head was parsed
            self.amux_disarm()

    def connection_lost(self, exc: BaseException | None) -> None:  # noqa: D102
        self.amux_disarm()
        super().connection_lost(exc)


class GuardedServer(Server):
    """aiohttp's protocol factory, making guarded handlers and counting what the guard did."""

    limits: ConnectionLimits
    pending: set[GuardedRequestHandler]
    closed_slow: int
    refused: int

    def __call__(self) -> RequestHandler:  # noqa: D102
        return GuardedRequestHandler(self, loop=self._loop, **self._kwargs)


class GuardedAppRunner(web.AppRunner):
    """An AppRunner whose connections are guarded by `limits`."""

    def __init__(self, app: web.Application, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.limits = limits

    async def _make_server(self) -> Server:
        server = await super()._make_server()
        server.__class__ = GuardedServer  # same state; only the protocol factory differs
        server.limits, server.pending, server.closed_slow, server.refused = self.limits, set(), 0, 0
        return server


def rearm(request: web.Request) -> None:
    """After a response, give the connection `header_timeout_s` for its next request head."""
    protocol = request.protocol
    if isinstance(protocol, GuardedRequestHandler) and request.headers.get("Upgrade", "").lower() != "websocket":
        protocol.amux_arm()
