"""Serve the MCP SDK's Streamable HTTP transport (stateless, JSON) at `/mcp` inside aiohttp.

The SDK's session manager is an ASGI app. It is called here through a small bridge instead of a generic
ASGI adapter, because the bridge must keep the ASGI promises the SDK relies on: `receive()` reports
`http.disconnect` once the response is complete or the client has gone (anything that waits for it
would otherwise spin), a client that disconnects mid-request cancels the work done for it, and a client
that never reads cannot hold a handler forever.

Only `POST` is served. `GET` (the optional server-to-client stream) answers 405, as the spec allows for a
server that offers none: a stateless hub has no session to push into, and an idle stream per client per
replica would cost a connection for nothing. `DELETE` answers 405 too (there is no session to end).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, AsyncIterator

from aiohttp import web
from mcp.server.mcpserver import MCPServer
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from multidict import CIMultiDict

from .. import logs
from ..errors import AmuxError
from ..mcp.client_sessions import ClientSessions, labeled
from ..services.auth.service import AuthService
from ..store.db import is_unavailable, unavailable_text
from ..logs import REQUEST_ID
from .oauth import challenge as oauth_challenge

log = logging.getLogger("amux.mcp")

SESSION_HEADER = "Mcp-Session-Id"
WATCH_S = 0.5            # how often a long-running request checks that its client is still there
DISCONNECT_GRACE_S = 1.0  # how long the app may wind down by itself after its client left
WRITE_TIMEOUT_S = 30.0   # a client that reads nothing for this long is disconnected
MAX_BODY = 1024 * 1024   # one JSON-RPC message; larger answers 413


def _refusal(status: int, code: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}
    return web.json_response(body, status=status, headers=headers)


async def _database_down(request: web.Request, error: BaseException) -> web.Response:
    """Answer a request whose token could not be checked because the database is unavailable: a tool call gets a
    tool error naming the fix (retry, with the request id), anything else a JSON-RPC error saying the same."""
    rid = request.get(REQUEST_ID) or ""
    log.warning("MCP request %s: the database is unavailable (%s); answered retry", rid, type(error).__name__)
    text = unavailable_text(rid)
    try:
        msg = json.loads(await request.read())
    except (ValueError, web.HTTPException):
        msg = None
    rpc_id = msg.get("id") if isinstance(msg, dict) else None
    if isinstance(msg, dict) and msg.get("method") == "tools/call":
        result = {"content": [{"type": "text", "text": text}], "isError": True}
        return web.json_response({"jsonrpc": "2.0", "id": rpc_id, "result": result}, headers={"Retry-After": "2"})
    return web.json_response({"jsonrpc": "2.0", "id": rpc_id, "error": {"code": -32603, "message": text}},
                             status=503, headers={"Retry-After": "2"})


def method_not_allowed(method: str) -> web.Response:
    """Answer a method the stateless transport does not serve, naming what it does."""
    what = ("this hub offers no server-to-client stream (stateless); send requests with POST"
            if method == "GET" else "there is no session to end: the hub is stateless"
            if method == "DELETE" else "use POST")
    return _refusal(405, -32000, f"Method Not Allowed: {what}", {"Allow": "POST"})


class AsgiExchange:
    """One HTTP request handed to an ASGI app, with disconnects passed through."""

    def __init__(self, request: web.Request, body: bytes, state: dict[str, Any],
                 on_start: Any = None) -> None:
        self.request = request
        self.state = state
        self._body: bytes | None = body
        self._on_start = on_start
        self._done = asyncio.Event()   # the response is complete or the client is gone
        self._status = 500
        self._headers: CIMultiDict[str] = CIMultiDict()
        self.response: web.StreamResponse | None = None

    def scope(self) -> dict[str, Any]:
        """Build the ASGI HTTP scope."""
        r = self.request
        peer = r.transport.get_extra_info("peername") if r.transport else None
        sock = r.transport.get_extra_info("sockname") if r.transport else None
        return {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": f"{r.version.major}.{r.version.minor}", "method": r.method, "scheme": r.scheme,
            "path": r.path, "raw_path": r.raw_path.split("?", 1)[0].encode(), "query_string": r.query_string.encode(),
            "root_path": "", "headers": [(k.lower(), v) for k, v in r.raw_headers],
            "client": tuple(peer[:2]) if isinstance(peer, tuple) else None,
            "server": tuple(sock[:2]) if isinstance(sock, tuple) else None,
            "state": self.state,
        }

    async def receive(self) -> dict[str, Any]:
        """Hand over the body once; afterwards wait until the response is complete or the client left."""
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self._done.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        """Turn ASGI response messages into an aiohttp response (buffered when it comes in one piece)."""
        kind = message["type"]
        if kind == "http.response.start":
            self._status = message["status"]
            for k, v in message.get("headers", ()):
                self._headers.add(k.decode("latin-1"), v.decode("latin-1"))
            if self._on_start is not None:
                self._on_start(self._status, self._headers)
            return
        if kind != "http.response.body" or self._done.is_set():
            return  # after the end or a disconnect, ASGI sends are no-ops
        chunk, more = message.get("body", b""), message.get("more_body", False)
        if self.response is None and not more:
            self.response = web.Response(status=self._status, body=chunk, headers=self._headers)
            self._done.set()
            return
        try:
            if self.response is None:
                self.response = web.StreamResponse(status=self._status, headers=self._headers)
                await self.response.prepare(self.request)
            if chunk:
                await asyncio.wait_for(self.response.write(chunk), WRITE_TIMEOUT_S)
            if not more:
                await self.response.write_eof()
                self._done.set()
        except (ConnectionError, asyncio.TimeoutError):
            self._client_gone()

    def _client_gone(self) -> None:
        self._done.set()
        if self.request.transport is not None:
            self.request.transport.close()

    def peer_left(self) -> bool:
        """Say whether the client's connection is gone (or closing)."""
        transport = self.request.transport
        return transport is None or transport.is_closing()

    def release_receivers(self) -> None:
        """Tell every `receive()` waiting for the end that the client disconnected."""
        self._done.set()

    async def run(self, app: Any) -> web.StreamResponse:
        """Run `app` for this request in the handler's own task; cancel it if the client disconnects before it is done.

        A timer looks at the connection every `WATCH_S` (no second task, no `asyncio.wait` per request): when the
        client is gone, receivers learn of the disconnect at once and the app is cancelled after a grace. A
        cancellation from outside (shutdown) takes the app's work with it and propagates.
        """
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        watch = _Watch(self, task, loop)
        try:
            await app(self.scope(), self.receive, self.send)
        except asyncio.CancelledError:
            if not watch.cancelled:
                raise
        finally:
            watch.stop()
        self._done.set()
        if self.response is None:  # the app ended without answering (cancelled): the client is gone anyway
            return web.Response(status=499 if self.peer_left() else 500)
        return self.response


class _Watch:
    """The timer that cancels an exchange's app once its client has left (and a grace has passed)."""

    __slots__ = ("exchange", "task", "loop", "handle", "running", "cancelled")

    def __init__(self, exchange: AsgiExchange, task: asyncio.Task[Any], loop: asyncio.AbstractEventLoop) -> None:
        self.exchange, self.task, self.loop = exchange, task, loop
        self.running, self.cancelled = True, False
        self.handle: asyncio.TimerHandle | None = loop.call_later(WATCH_S, self._look)

    def _look(self) -> None:
        if not self.running:
            return
        if self.exchange.peer_left():
            self.exchange.release_receivers()  # a receiver learns of the disconnect; cancel after a grace
            self.handle = self.loop.call_later(DISCONNECT_GRACE_S, self._cancel)
        else:
            self.handle = self.loop.call_later(WATCH_S, self._look)

    def _cancel(self) -> None:
        if self.running:  # the task waits inside the app: the cancellation lands there
            self.cancelled = True
            self.task.cancel()

    def stop(self) -> None:
        """The app is done: stop looking, and take back a cancellation the app swallowed."""
        self.running = False
        if self.handle is not None:
            self.handle.cancel()
        if self.cancelled:
            self.task.uncancel()


class McpMount:
    """Authenticate at the door (401 with the fix), tell clients apart, then pass the request to the MCP app."""

    def __init__(self, server: MCPServer, auth: AuthService) -> None:
        self.server = server
        self.auth = auth
        self.sessions: ClientSessions | None = None  # set by `lifespan` from the shared key
        # Every request carries a bearer token that a page rebinding a hostname cannot have, so the SDK's
        # Host/Origin allow-list (which would refuse a hub reached under any other name) is not needed.
        server.streamable_http_app(stateless_http=True, json_response=True, max_request_body_size=MAX_BODY,
                                   transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
        self.manager: StreamableHTTPSessionManager = server.session_manager

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Answer one MCP HTTP request."""
        try:
            caller = await self.auth.authenticate_mcp(request.headers.get("Authorization"))
            logs.note_caller(caller.principal, caller.label)
        except AmuxError as e:
            return web.json_response({"error": "invalid_token", "error_description": e.message}, status=401,
                                     headers={"WWW-Authenticate": oauth_challenge(request, e.message)})
        except Exception as e:
            if not is_unavailable(e):
                raise
            return await _database_down(request, e)
        if request.method != "POST":
            return method_not_allowed(request.method)
        if request.content_length is not None and request.content_length > MAX_BODY:
            return _refusal(413, -32600, f"request body over {MAX_BODY} bytes: send one JSON-RPC message at a time")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _refusal(413, -32600, f"request body over {MAX_BODY} bytes: send one JSON-RPC message at a time")
        sessions = self.sessions
        client = sessions.client_of(request.headers.get(SESSION_HEADER), caller.token_id) if sessions else None
        state: dict[str, Any] = {"caller": labeled(caller, client), "token_caller": caller}

        def on_start(status: int, headers: CIMultiDict[str]) -> None:
            name = state.get("declared")
            if name and sessions is not None and 200 <= status < 300:
                headers[SESSION_HEADER] = sessions.issue(caller.token_id, name)

        exchange = AsgiExchange(request, body, state, on_start)
        return await exchange.run(self.manager.handle_request)

    @contextlib.asynccontextmanager
    async def lifespan(self, key: bytes) -> AsyncIterator[None]:
        """Run the SDK's session manager for the app's lifetime, in a task of its own.

        The SDK's manager holds an anyio cancel scope, which must be left by the task that entered it;
        aiohttp may start and clean up an app from different tasks.
        """
        self.sessions = ClientSessions(key)
        started, stop = asyncio.Event(), asyncio.Event()

        async def hold() -> None:
            async with self.manager.run():
                started.set()
                await stop.wait()

        task = asyncio.create_task(hold())
        waiter = asyncio.create_task(started.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if task.done():
            task.result()  # raise the startup error
        try:
            yield
        finally:
            stop.set()
            await task

