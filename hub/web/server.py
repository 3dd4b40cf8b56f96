"""The aiohttp server with limits for slow and idle clients (aiohttp itself has no request-head timeout).

- A request head must arrive within `header_timeout_s` of the connection opening or of the previous
  response (a keep-alive connection idle that long is closed too); a slowloris never finishes one.
- At most `max_pending_connections` connections may be waiting for a request head at once; past
  that, new ones are closed at once (an authenticated client's request in flight is not counted).
- One client (a remote IP address) may have at most `max_pending_per_client` of them, and at most
  `max_connections_per_client` connections open, so one client's idle sockets cannot lock the others
  out; past either, that client's new connections are closed at once (0 turns a limit off).
- Bodies must arrive within `body_timeout_s` (the edge middleware reads them: 408).
- A request aiohttp cannot parse (a garbage request line, a bad header) is answered 400 and logged as
  one WARNING line without a traceback, at most once a minute per client (by the injected clock), as
  are a client's refused connections: nobody can flood the log.
"""
from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections import Counter
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_server import Server

from ..clock import Clock, SystemClock
from ..domain.rate import WindowLimit
from ..errors import Invalid

log = logging.getLogger("amux.web")


@dataclass(frozen=True, kw_only=True)
class ConnectionLimits:
    """The numbers (settings `hub.header_timeout_s`, `hub.max_pending_connections`, `hub.max_pending_per_client`,
    `hub.max_connections_per_client`)."""

    header_timeout_s: float = 15.0
    max_pending_connections: int = 512
    max_pending_per_client: int = 64
    max_connections_per_client: int = 256
    log_every_s: float = 60.0  # one WARNING per client and kind of trouble in this long


class GuardedRequestHandler(RequestHandler):
    """A request handler that closes connections which do not deliver a request head in time."""

    def __init__(self, manager: "GuardedServer", **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._amux_server = manager
        self._amux_timer: asyncio.TimerHandle | None = None
        self.amux_client: str | None = None  # the remote IP address, once connected (None: a Unix socket)

    def amux_arm(self) -> None:
        """Start waiting for the next request head (at connection start, and after each response)."""
        self.amux_disarm()
        if self._messages:  # the next request head is already here (pipelining)
            return
        self._amux_server.start_waiting(self)
        self._amux_timer = self._loop.call_later(self._amux_server.limits.header_timeout_s, self._amux_expire)

    def amux_disarm(self) -> None:
        """Stop waiting: a request head arrived, or the connection is gone."""
        if self._amux_timer is not None:
            self._amux_timer.cancel()
            self._amux_timer = None
        self._amux_server.stop_waiting(self)

    def _amux_expire(self) -> None:
        self._amux_timer = None
        self._amux_server.stop_waiting(self)
        self._amux_server.closed_slow += 1
        if self.transport is not None:
            self.transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        client = peer[0] if isinstance(peer, tuple) and peer else None
        why = self._amux_server.admit(client)
        if why:
            self._amux_server.refused += 1
            self._amux_server.warn(client, "refused", "closing a new connection from %s: %s", client, why)
            transport.close()
            return
        self.amux_client = client
        self.amux_arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._amux_timer is not None and self._messages:  # a whole request head was parsed
            self.amux_disarm()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.amux_disarm()
        self._amux_server.disconnected(self.amux_client)
        self.amux_client = None
        super().connection_lost(exc)

    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """Answer a request aiohttp could not parse with a JSON 400, logged once a minute per client."""
        if not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        client = self.amux_client or "a local socket"
        why = str(exc.message or exc)[:200].encode("unicode_escape").decode()  # one printable line
        self._amux_server.malformed += 1
        self._amux_server.warn(client, "malformed", "malformed HTTP request from %s: %s (one line a minute per "
                               "client)", client, why)
        if request.writer.output_size > 0:
            raise ConnectionError("a response was already sent; the connection is closed")
        rid = secrets.token_hex(8)
        fix = f"send a well-formed HTTP/1.1 request (RFC 9112); the hub could not parse this one: {why}"
        body = {"error": "malformed_request", "fix": fix, "message": fix, "request_id": rid}
        resp = web.Response(status=status, text=json.dumps(body), content_type="application/json",
                            headers={"X-Request-Id": rid})
        resp.force_close()
        return resp


class GuardedServer(Server):
    """aiohttp's protocol factory, making guarded handlers and counting what the guard did."""

    limits: ConnectionLimits
    clock: Clock
    pending: set[GuardedRequestHandler]
    pending_by_client: Counter[str]
    open_by_client: Counter[str]
    warned: WindowLimit
    closed_slow: int
    refused: int
    malformed: int

    def __call__(self) -> RequestHandler:
        return GuardedRequestHandler(self, loop=self._loop, **self._kwargs)

    def admit(self, client: str | None) -> str | None:
        """Count a new connection of `client` as open; return why it must be closed instead, or None."""
        lim = self.limits
        if len(self.pending) >= lim.max_pending_connections:
            return (f"{len(self.pending)} connections are waiting for a request head "
                    "(hub.max_pending_connections)")
        if client is None:
            return None
        if 0 < lim.max_pending_per_client <= self.pending_by_client[client]:
            return (f"it has {self.pending_by_client[client]} connections waiting for a request head "
                    "(hub.max_pending_per_client)")
        if 0 < lim.max_connections_per_client <= self.open_by_client[client]:
            return f"it has {self.open_by_client[client]} connections open (hub.max_connections_per_client)"
        self.open_by_client[client] += 1
        return None

    def disconnected(self, client: str | None) -> None:
        """Forget a connection counted by `admit`."""
        if client is not None:
            _decrement(self.open_by_client, client)

    def start_waiting(self, handler: GuardedRequestHandler) -> None:
        """Count `handler` as waiting for a request head."""
        if handler not in self.pending:
            self.pending.add(handler)
            if handler.amux_client is not None:
                self.pending_by_client[handler.amux_client] += 1

    def stop_waiting(self, handler: GuardedRequestHandler) -> None:
        """Stop counting `handler` as waiting for a request head."""
        if handler in self.pending:
            self.pending.discard(handler)
            if handler.amux_client is not None:
                _decrement(self.pending_by_client, handler.amux_client)

    def warn(self, client: str | None, kind: str, msg: str, *args: Any) -> None:
        """Log one WARNING line, at most once per client and kind in `limits.log_every_s` (by the clock)."""
        if self.warned.hit((kind, client), self.clock.now()) is None:
            log.warning(msg, *args)


def _decrement(counts: Counter[str], key: str) -> None:
    counts[key] -= 1
    if counts[key] <= 0:
        del counts[key]


class GuardedAppRunner(web.AppRunner):
    """An AppRunner whose connections are guarded by `limits`, logging by `clock`."""

    def __init__(self, app: web.Application, limits: ConnectionLimits, clock: Clock | None = None,
                 **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.limits = limits
        self.clock = clock or SystemClock()

    async def _make_server(self) -> Server:
        server = await super()._make_server()
        server.__class__ = GuardedServer  # same state; only the protocol factory differs
        guarded = cast(GuardedServer, server)
        guarded.limits, guarded.clock, guarded.pending = self.limits, self.clock, set()
        guarded.pending_by_client, guarded.open_by_client = Counter(), Counter()
        guarded.warned = WindowLimit(1, self.limits.log_every_s)
        guarded.closed_slow = guarded.refused = guarded.malformed = 0
        return guarded


def rearm(request: web.Request) -> None:
    """After a response, give the connection `header_timeout_s` for its next request head."""
    protocol = request.protocol
    if isinstance(protocol, GuardedRequestHandler) and request.headers.get("Upgrade", "").lower() != "websocket":
        protocol.amux_arm()


def listen_address(listen: str) -> tuple[str, int]:
    """Split `HOST:PORT` (port 0: pick a free one); raise naming the fix when malformed."""
    host, _, port = listen.rpartition(":")
    try:
        number = int(port)
        if not 0 <= number <= 65535:
            raise ValueError(port)
    except ValueError as e:
        raise Invalid(f"--listen {listen!r} is not HOST:PORT; pass e.g. 127.0.0.1:8787 (port 0 picks a free "
                      "one)") from e
    return host.strip("[]") or "127.0.0.1", number


def url_of(host: str, port: int) -> str:
    """Return the http URL a client uses to reach a hub bound to `host:port` (a wildcard host → loopback)."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "[::1]"
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"
